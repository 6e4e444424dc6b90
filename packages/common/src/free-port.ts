import net from 'node:net';

/**
 * A TCP port on 127.0.0.1 that nothing listens on right now: the kernel picks one for a listener that is closed
 * at once. Another process can take it before the caller does; good enough for a child server started next.
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}
