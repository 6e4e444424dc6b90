import net from 'node:net';
import { TransferRate } from '@hangar/agent/peer-fetch';

// The control plane's uplink, for bench/peers.ts: a TCP proxy in front of Hangar whose every byte towards the nodes
// takes from one rate, as one network link would carry them (the mirror's files, GraphQL, the agents' WebSockets
// alike). Stands in for a real link, which loopback does not have.

export async function originLink(bytesPerSecond: number) {
  let port = 0;
  const link = new TransferRate(bytesPerSecond);
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const up = net.connect(port, '127.0.0.1');
    for (const s of [client, up]) {
      sockets.add(s);
      s.once('close', () => {
        sockets.delete(s);
        client.destroy();
        up.destroy();
      });
      s.on('error', () => {});
    }
    client.pipe(up);
    // Towards the node: paused while the link is busy, so TCP's own flow control slows Hangar down.
    up.on('data', (chunk: Buffer) => {
      up.pause();
      void link.take(chunk.length).then(() => {
        if (!client.destroyed) client.write(chunk);
        up.resume();
      });
    });
    up.once('end', () => client.end());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    /** Where Hangar listens, once it does. */
    to(target: string) {
      port = Number(new URL(target).port);
    },
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
