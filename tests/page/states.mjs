// The live waiting page in headless Chromium against a running proxy: which state it shows, and
// when it calls again (contract section 10: `pollAfter` seconds after each answer, plus up to 10 %
// jitter; a refusal's Retry-After likewise).
//
//   node tests/page/states.mjs <proxy base url> <artifact dir> --expect STATE [--calls N]
//        [--prefix /queue] [--user page-user] [--steal-clock-after MS] [--no-identity]
//        [--linger MS]
//
// tests/page.rs prepares a room that answers the page's user with STATE (a full room, a stopped
// Redis, enforced polling, an address over its limit, or a plain line) and runs this. The script
// opens the page, waits until `[data-waitroom="state"]` shows STATE, lets the page make `--calls`
// calls to the room's endpoints, and prints as its last stdout line a JSON summary:
// `{ states: [...], calls: [{ name, status, start, end }], heading, message, eta, signIn, seed }`
// (signIn: the sign-in link's href, seed: the seed hash shown, each null when not shown), times in
// ms on the page's clock
// (Resource Timing: `start` when the request began, `end` when its body had arrived), so that
// tests/page.rs can check each gap between an answer and the next call.
//
// `--steal-clock-after MS`: MS after the page's first answer, the script itself polls status as
// the page's user (on time): under enforced polling that restarts the user's poll clock, so the
// page's own next poll comes too early and is refused with TOO_EARLY.
//
// `--linger MS`: once the calls are in, watch MS longer before the summary, so that a call the page
// should not make has the time to show up.
//
// `--no-identity`: the browser sends no identity header, like a browser opened straight on the
// proxy with nothing in front to name the user.
//
// Chromium: see browser.mjs.

import { join } from "node:path";
import { runInChromium } from "./browser.mjs";
import { parseArgs } from "node:util";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    prefix: { type: "string", default: "/queue" },
    user: { type: "string", default: "page-user" },
    expect: { type: "string" },
    calls: { type: "string", default: "3" },
    "steal-clock-after": { type: "string" },
    "no-identity": { type: "boolean", default: false },
    linger: { type: "string", default: "0" },
  },
});
const [base, artifacts] = positionals;
if (!base || !artifacts || !opts.expect) {
  console.error("usage: node states.mjs <proxy base url> <artifact dir> --expect STATE [--calls N] ...");
  process.exit(2);
}
const OVERALL_TIMEOUT_MS = 60_000;

function log(message) {
  console.log(`[states ${opts.expect} ${new Date().toISOString().slice(11, 23)}] ${message}`);
}

/** The page's polls of the room so far, from Resource Timing. The seed hash's fetch during an
 * event (`{prefix}/event`) follows an answer and is no poll: it is left out. */
const roomCalls = (page) =>
  page.evaluate((prefix) => {
    return performance
      .getEntriesByType("resource")
      .filter((e) => new URL(e.name).pathname.startsWith(`${prefix}/`) && e.initiatorType === "fetch")
      .filter((e) => new URL(e.name).pathname !== `${prefix}/event`)
      .map((e) => ({
        name: new URL(e.name).pathname.slice(prefix.length + 1),
        status: e.responseStatus,
        start: e.startTime,
        end: e.responseEnd,
      }));
  }, opts.prefix);

async function run(context) {
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  const states = [];
  await page.exposeFunction("recordState", (s) => states.push(s));

  const response = await page.goto(`${base}${opts.prefix}/`);
  if (response.status() !== 200) throw new Error(`page: HTTP ${response.status()}`);
  await page.evaluate(() => {
    // Every state the page shows, in order, as it shows it.
    const el = document.querySelector('[data-waitroom="state"]');
    new MutationObserver(() => window.recordState(el.textContent)).observe(el, { childList: true, characterData: true, subtree: true });
    if (el.textContent) window.recordState(el.textContent);
  });
  performance.setResourceTimingBufferSize?.(1000);

  if (opts["steal-clock-after"]) {
    await page.waitForFunction(() => performance.getEntriesByType("resource").some((e) => e.name.endsWith("/enter") && e.responseEnd > 0));
    await new Promise((r) => setTimeout(r, Number(opts["steal-clock-after"])));
    const res = await fetch(`${base}${opts.prefix}/status`, { headers: { "X-User-Id": opts.user } });
    log(`stole the poll clock: status ${res.status} ${await res.text()}`);
  }

  await page.waitForFunction(
    (want) => document.querySelector('[data-waitroom="state"]').textContent === want,
    opts.expect,
    { timeout: 20_000 },
  );
  log(`page shows ${opts.expect}`);

  const want = Number(opts.calls);
  const deadline = Date.now() + 40_000;
  let calls = await roomCalls(page);
  while (calls.filter((c) => c.end > 0).length < want && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    calls = await roomCalls(page);
  }
  await new Promise((r) => setTimeout(r, Number(opts.linger)));
  calls = await roomCalls(page);
  // Only after the calls of the summary are read: a screenshot can stall the page's renderer on
  // a busy machine, and a timer due meanwhile would fire late into a gap the test times.
  await page.screenshot({ path: join(artifacts, `${opts.expect.toLowerCase()}.png`), animations: "disabled" });
  if (pageErrors.length) throw new Error(`errors in the page: ${pageErrors.join("; ")}`);
  const shown = await page.evaluate(() => {
    const hook = (name) => document.querySelector(`[data-waitroom="${name}"]`);
    const visible = (el) => el !== null && !el.hidden && el.offsetParent !== null;
    return {
      heading: hook("heading")?.textContent ?? null,
      message: hook("message")?.textContent ?? null,
      eta: hook("eta")?.textContent ?? null,
      signIn: visible(hook("sign-in")) ? hook("sign-in").getAttribute("href") : null,
      seed: visible(hook("seed")) ? hook("seed-sha256").textContent : null,
    };
  });
  return { states, calls, ...shown };
}

await runInChromium({
  name: `states ${opts.expect}`,
  artifacts,
  failureShot: `failure-${opts.expect.toLowerCase()}.png`,
  timeoutMs: OVERALL_TIMEOUT_MS,
  contextOptions: { extraHTTPHeaders: opts["no-identity"] ? {} : { "X-User-Id": opts.user } },
  run,
});
