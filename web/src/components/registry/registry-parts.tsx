import type { Bytes } from '../../graphql/types';
import { formatBytes } from '../../lib/format';

// Small pieces of the registry explorer: how a set's verdict, memory estimate and fits read to an operator.

export type Verdict = { servable: boolean; reason: string; neededBuild: number | null };
export type MemoryEstimate = {
  context: number;
  weightsBytes: Bytes;
  kvCacheBytes: Bytes;
  overheadBytes: Bytes;
  totalBytes: Bytes;
  basis: string;
};
export type Fits = {
  summary: string;
  disk: { fits: boolean; freeBytes: Bytes; neededBytes: Bytes };
  nodes: { node: string; fits: boolean; freeMiB: number; neededMiB: number; reason: string }[];
};

const tokens = new Intl.NumberFormat('en');

/** The server's reason, word for word: it names the architecture and the llama.cpp build that decide. */
export function VerdictText({ verdict }: { verdict: Verdict }) {
  return (
    <div className="verdict">
      <span className={`badge ${verdict.servable ? 'ok' : 'bad'}`}>
        {verdict.servable ? 'servable' : 'not servable'}
      </span>
      <div className={verdict.servable ? 'sub' : 'reason'}>{verdict.reason}</div>
    </div>
  );
}

/** The total a replica needs, then what it is made of, at the context the estimate was made for. */
export function MemoryText({ memory }: { memory: MemoryEstimate | null }) {
  if (!memory) return <span className="muted">no estimate</span>;
  return (
    <div className="memory" title={memory.basis}>
      <span className="size">{formatBytes(memory.totalBytes)}</span>
      <div className="sub">
        {formatBytes(memory.weightsBytes)} weights + {formatBytes(memory.kvCacheBytes)} KV +{' '}
        {formatBytes(memory.overheadBytes)} overhead at {tokens.format(memory.context)} tokens
      </div>
    </div>
  );
}

/** Where it fits: the server's summary, then each online node and the mirror's disk. */
export function FitsText({ fits, label }: { fits: Fits; label: string }) {
  const { disk } = fits;
  return (
    <div className="fits">
      <div>{fits.summary}</div>
      {fits.nodes.length ? (
        <ul className="chips" aria-label={`Nodes for ${label}`}>
          {fits.nodes.map((n) => (
            <li key={n.node} className={`chip fit ${n.fits ? 'ok' : 'bad'}`} title={n.reason}>
              {n.node}: {n.fits ? 'fits' : 'does not fit'}
            </li>
          ))}
        </ul>
      ) : null}
      <div className={disk.fits ? 'sub' : 'reason'}>
        {disk.fits
          ? `mirror disk: ${formatBytes(disk.freeBytes)} free`
          : `mirror disk: needs ${formatBytes(disk.neededBytes)}, ${formatBytes(disk.freeBytes)} free`}
      </div>
    </div>
  );
}
