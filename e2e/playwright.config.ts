import path from 'node:path';
import { defineConfig } from '@playwright/test';
import { hubUrl } from './fixtures/stand-in-hub.js';

// The whole Hangar, as an operator gets it: the built console served by the server, on its embedded PostgreSQL
// in a data dir of its own, driven in Debian's Chromium.
const port = 4317;
const dataDir = path.join('/tmp', `hangar-e2e-${process.pid}`);
export const baseURL = `http://127.0.0.1:${port}`;
export const admin = { email: 'admin@example.com', password: 'correct-horse-battery' };

export default defineConfig({
  testDir: 'tests',
  // The stand-in Hub (fixtures/stand-in-hub.ts) the server's registry calls go to.
  globalSetup: './global-setup.ts',
  outputDir: 'artifacts/results',
  timeout: 60_000,
  workers: 1,
  reporter: [['list'], ['html', { outputFolder: 'artifacts/report', open: 'never' }]],
  use: {
    baseURL,
    viewport: { width: 1280, height: 800 },
    screenshot: 'on',
    trace: 'retain-on-failure',
    launchOptions: {
      executablePath: '/usr/bin/chromium',
      // Without the networking flags Chromium keeps calling hosts this machine cannot reach.
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run',
      ],
    },
  },
  webServer: {
    command: `rm -rf ${dataDir} && pnpm --dir ../server exec tsx src/main.ts`,
    url: `${baseURL}/readyz`,
    timeout: 120_000,
    reuseExistingServer: false,
    // Playwright's default end is SIGKILL, which leaves the embedded PostgreSQL running behind the dead server
    // (one per run, holding its port and memory). SIGTERM is the server's own stop: requests, then PostgreSQL.
    gracefulShutdown: { signal: 'SIGTERM', timeout: 20_000 },
    stdout: 'pipe',
    env: {
      PORT: String(port),
      HANGAR_DATA_DIR: dataDir,
      HANGAR_ADMIN_EMAIL: admin.email,
      HANGAR_ADMIN_PASSWORD: admin.password,
      HANGAR_LOG_LEVEL: 'warn',
      HANGAR_HUB_URL: hubUrl,
      // The slow upstream the mirror spec fetches from listens on loopback, which is refused unless listed.
      HANGAR_FETCH_ALLOW: '127.0.0.1',
      // The autoscaling spec's window: a replica added after two busy seconds, not a minute.
      HANGAR_SCALE_WINDOW_SECONDS: '2',
    },
  },
});
