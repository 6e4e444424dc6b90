// @huggingface/hub is imported at the first call to the Hub (the explorer's search, a pull-through miss), not at
// the server's start: it loads its upload hashers (blake3, xet chunking, their wasm) with it, and an air-gapped
// site never calls the Hub at all.
type HubLibrary = typeof import('@huggingface/hub');
let library: Promise<HubLibrary> | undefined;

export function hubLibrary(): Promise<HubLibrary> {
  library ??= import('@huggingface/hub');
  return library;
}
