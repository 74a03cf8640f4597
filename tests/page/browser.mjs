// What the page's browser scripts (e2e.mjs, states.mjs) share: one headless Chromium with a
// throw-away profile, an overall time limit, the JSON summary as the last stdout line, a
// screenshot on failure, and the exit code tests/page.rs reads.
//
// Chromium: /usr/bin/chromium (Debian's `chromium` package) unless WAITROOM_CHROMIUM names another.

import { chromium } from "playwright-core";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-proxy-server",
];

/**
 * Launches Chromium with `contextOptions` (merged over the defaults), runs `run(context)`, prints
 * its result as JSON and exits 0; on an error or after `timeoutMs`, prints it, saves
 * `<artifacts>/<failureShot>` and exits 1.
 */
export async function runInChromium({ name, artifacts, failureShot, timeoutMs, contextOptions, run }) {
  const timeout = setTimeout(() => {
    console.error(`${name}: gave up after ${timeoutMs} ms`);
    process.exit(1);
  }, timeoutMs);
  await mkdir(artifacts, { recursive: true });
  const userDataDir = await mkdtemp(join(tmpdir(), "waitroom-chromium-"));
  let context;
  let exitCode = 0;
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: process.env.WAITROOM_CHROMIUM || "/usr/bin/chromium",
      headless: true,
      args: CHROMIUM_ARGS,
      locale: "en-US",
      ...contextOptions,
    });
    console.log(JSON.stringify(await run(context)));
  } catch (e) {
    console.error(`${name} failed: ${e.stack ?? e}`);
    const page = context?.pages()[0];
    if (page) await page.screenshot({ path: join(artifacts, failureShot) }).catch(() => {});
    exitCode = 1;
  } finally {
    await context?.close().catch(() => {});
    await rm(userDataDir, { recursive: true, force: true });
    clearTimeout(timeout);
  }
  process.exit(exitCode);
}
