import { startStandInHub } from './fixtures/stand-in-hub.js';

// Playwright starts the webServer (the Hangar server) first and runs this after it; the server asks the registry
// only when a page does, so a Hub up before the first test is up in time. What this returns runs at the end.
export default async function globalSetup() {
  return await startStandInHub();
}
