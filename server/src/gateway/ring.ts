// Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam; the scheme KubeAI's PrefixHash and
// Vimeo's proxies use): every replica of a model owns points on a ring of 32-bit hashes, a request's key names the
// first point at or after its own hash, and that point's replica takes it unless it already carries more than
// `factor` times the mean load, in which case the walk goes on to the next replica. Why a ring and not `key % n`:
// a replica joining or leaving moves only the keys it takes or gave, so the other replicas keep their warm caches.
// The ring depends only on the replica ids, so every server process builds the same one and routes a conversation
// to the same replica without talking to the others.

/** Points per replica: enough that two replicas split keys about evenly (the spread is about 1/sqrt(points)). */
const POINTS_PER_REPLICA = 160;
const FNV_OFFSET = 0x811c9dc5;

/** FNV-1a over a string's UTF-16 code units, continuing from `h`: feeding parts in turn costs no concatenation. */
export function hashText(text: string, h: number = FNV_OFFSET, limit = text.length): number {
  const end = Math.min(limit, text.length);
  for (let i = 0; i < end; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** murmur3's finalizer: FNV's low bits barely change between similar ids ("…#1", "…#2"), the ring needs them spread. */
export function mix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

export class HashRing {
  /** Sorted ring points, and for each the index (in `ids`) of the replica that owns it. */
  private readonly points: Uint32Array;
  private readonly owners: Uint16Array;
  /** Which replicas a walk has passed, stamped with the walk's number so nothing is cleared or allocated per walk. */
  private readonly seen: Uint32Array;
  private stamp = 0;

  constructor(readonly ids: readonly string[]) {
    const n = ids.length * POINTS_PER_REPLICA;
    const pairs: [number, number][] = [];
    for (const [i, id] of ids.entries()) {
      const base = hashText(id);
      for (let p = 0; p < POINTS_PER_REPLICA; p++) pairs.push([mix(hashText(`#${p}`, base)), i]);
    }
    // Ties (two replicas on one point) broken by id, not by the order the rows came in: every server agrees.
    pairs.sort((a, b) => a[0] - b[0] || (ids[a[1]]! < ids[b[1]]! ? -1 : 1));
    this.points = new Uint32Array(n);
    this.owners = new Uint16Array(n);
    for (const [k, [point, owner]] of pairs.entries()) {
      this.points[k] = point;
      this.owners[k] = owner;
    }
    this.seen = new Uint32Array(ids.length);
  }

  /**
   * The replica (index into `ids`) a key goes to: the first one from the key's point on that `eligible` admits
   * and whose load is under the bound, each replica looked at once; -1 when none is eligible. `load` and `eligible`
   * are asked of replica indexes; `bound` is the most in-flight requests the named replica may already carry.
   */
  pick(key: number, bound: number, eligible: (i: number) => boolean, load: (i: number) => number): number {
    const n = this.points.length;
    if (n === 0) return -1;
    const stamp = ++this.stamp;
    if (stamp === 0xffffffff) {
      this.seen.fill(0);
      this.stamp = 1;
    }
    let start = lowerBound(this.points, mix(key));
    if (start === n) start = 0;
    let firstEligible = -1;
    let looked = 0;
    for (let k = 0; k < n && looked < this.ids.length; k++) {
      const owner = this.owners[(start + k) % n]!;
      if (this.seen[owner] === this.stamp) continue;
      this.seen[owner] = this.stamp;
      looked++;
      if (!eligible(owner)) continue;
      if (firstEligible < 0) firstEligible = owner;
      if (load(owner) < bound) return owner;
    }
    // Every eligible replica is at the bound (it cannot be, as bounds are worked out, but a caller may pass one):
    // the key's own replica, which at least holds its prefix.
    return firstEligible;
  }
}

/**
 * The most in-flight requests a replica may already carry and still take a keyed request: the mean over the
 * eligible replicas, this request counted, times the factor, rounded up (so at least one, and an idle fleet always
 * admits the key's own replica).
 */
export function loadBound(totalInFlight: number, replicas: number, factor: number): number {
  return Math.ceil(((totalInFlight + 1) / replicas) * factor);
}

function lowerBound(points: Uint32Array, value: number): number {
  let lo = 0;
  let hi = points.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (points[mid]! < value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
