// The waiting page's decisions, as pure functions: what an answer means, when to call next and
// which endpoint, how to word a wait. No DOM, no timers, no fetch, so `node --test` can check
// them (tests/page/poll.test.mjs) and the page script (page.js) only renders and schedules.
//
// An "answer" is what the page got back from one call:
//   { httpStatus, retryAfter, body }
// httpStatus 0 means the request never got an answer (network error, timeout); retryAfter is the
// Retry-After header in seconds (see parseRetryAfter) or null; body is the parsed JSON or {}.
//
// page.rs inlines this file, then page.js, into one <script type="module">: the exports below are
// how the tests import it and are harmless in the page.

/** The states `[data-waitroom="state"]` may hold (contract sections 10 and 14). */
export const STATES = [
  "WAITING", "READY", "FULL", "NOT_IN_QUEUE", "UNAVAILABLE", "TOO_EARLY", "LIMITED",
  "NOT_OPEN", "PREQUEUED", "CLOSED", "SIGN_IN",
];

/** A scheduled event's states before its opening: they count down to it (`opensIn`). */
export const BEFORE_OPENING = ["NOT_OPEN", "PREQUEUED"];

/** Jitter added on top of every wait: up to this fraction, so pages do not poll in lockstep. */
export const JITTER = 0.1;

/** Wait when an answer says nothing usable (no answer, no Retry-After, an unexpected status). */
export const FALLBACK_SECONDS = 5;

/** Never call again sooner than this, whatever an answer says: a 0 must not become a hot loop
 * (but for WAITING's pollAfter 0, which the proxy answers with a held poll: see nextDelay). */
export const MIN_SECONDS = 1;

/**
 * Retry-After as seconds: delta-seconds or an HTTP-date (RFC 9110), null when absent or unusable.
 * `now` is milliseconds since the epoch (Date.now()).
 */
export function parseRetryAfter(value, now) {
  if (value === null || value === undefined) return null;
  const text = String(value).trim();
  if (/^\d+$/.test(text)) return Number(text);
  // An HTTP-date names its weekday and month; Date.parse alone would also take "-3" as a year.
  if (!/^[A-Za-z]{3}, /.test(text)) return null;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return null;
  return Math.max(0, Math.ceil((at - now) / 1000));
}

/** The state this answer puts the page in: one of STATES. */
export function stateOf(answer) {
  const status = answer.body && answer.body.status;
  if (answer.httpStatus === 200 && ["WAITING", "READY", "NOT_IN_QUEUE", ...BEFORE_OPENING, "CLOSED"].includes(status)) {
    return status;
  }
  if (answer.httpStatus === 429 && ["FULL", "TOO_EARLY", "LIMITED"].includes(status)) return status;
  // 401: the room reached, but nobody named (no identity header, or a missing or expired JWT).
  // Telling the user the line is down would send them to wait for nothing; they must sign in.
  if (answer.httpStatus === 401) return "SIGN_IN";
  // 503 (Redis unavailable), no answer at all, or anything unexpected (a 502 from a load balancer):
  // the line cannot be reached, retry later.
  return "UNAVAILABLE";
}

/**
 * Milliseconds until the next call, or null when the page should stop polling (READY, NOT_IN_QUEUE:
 * their pollAfter is null). `random` is a number in [0, 1) (Math.random()); the wait is the told
 * number of seconds times 1 + JITTER * random, so never sooner than told.
 */
export function nextDelay(answer, random) {
  const seconds = waitSeconds(answer);
  if (seconds === null) return null;
  // WAITING with pollAfter 0: the user is near the front and the proxy holds the next status
  // open until their admission, so asking at once is no loop (and any pause would delay READY).
  if (seconds === 0 && stateOf(answer) === "WAITING") return 0;
  return Math.round(Math.max(seconds, MIN_SECONDS) * 1000 * (1 + JITTER * random));
}

function waitSeconds(answer) {
  const body = answer.body || {};
  switch (stateOf(answer)) {
    case "WAITING":
    case "NOT_OPEN":
    case "PREQUEUED":
      return usable(body.pollAfter) ?? FALLBACK_SECONDS;
    case "READY":
    case "NOT_IN_QUEUE":
    case "CLOSED":
    case "SIGN_IN":
      // SIGN_IN: asking again without an identity gets the same 401; signing in ends with a
      // reload, whose enter keeps any place the user had.
      return null;
    case "FULL":
    case "TOO_EARLY":
    case "LIMITED":
      return usable(body.retryAfter) ?? usable(answer.retryAfter) ?? FALLBACK_SECONDS;
    default:
      return usable(answer.retryAfter) ?? FALLBACK_SECONDS;
  }
}

function usable(seconds) {
  return typeof seconds === "number" && Number.isFinite(seconds) && seconds >= 0 ? seconds : null;
}

/**
 * Which call comes next: "enter", "status" or null (stop). `previous` is the call that produced
 * the answer. FULL and LIMITED were refused entries, so the page enters again; TOO_EARLY was a
 * status call that came too soon; after no answer the same call is repeated, since the page cannot
 * know whether it reached the line.
 */
export function nextCall(answer, previous) {
  switch (stateOf(answer)) {
    case "WAITING":
    case "TOO_EARLY":
    case "PREQUEUED":
      return "status";
    case "FULL":
    case "LIMITED":
    case "NOT_OPEN":
      // NOT_OPEN queued nobody: the page enters again, and is pre-queued once that opens.
      return "enter";
    case "READY":
    case "NOT_IN_QUEUE":
    case "CLOSED":
    case "SIGN_IN":
      return null;
    default:
      return previous;
  }
}

/**
 * How far through the line the user is, 0..100: the share of the places ahead at entry that have
 * since been admitted. `atEntry` is the position first seen (the largest, since a place only moves
 * forward), `now` the current one.
 */
export function progressPercent(atEntry, now) {
  if (!(atEntry > 0) || !(now > 0) || now >= atEntry) return 0;
  return Math.round((100 * (atEntry - now)) / atEntry);
}

/**
 * An estimated wait in words, from the page's texts (`{n}` is replaced): never more precise than
 * the estimate deserves.
 */
export function etaText(seconds, texts) {
  // null: admission is paused, and nobody can say when it resumes (contract section 15).
  if (seconds === null) return texts.eta_paused;
  if (!(seconds > 0)) return texts.eta_soon;
  if (seconds < 60) return texts.eta_under_minute;
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return minutes === 1 ? texts.eta_minute : fill(texts.eta_minutes, { n: minutes });
  const hours = Math.round(minutes / 60);
  return hours === 1 ? texts.eta_hour : fill(texts.eta_hours, { n: hours });
}

/**
 * Whole seconds left until a scheduled event opens, from an answer's `opensIn` received at
 * `receivedAt` (ms since the epoch), at `now`: rounded up, never below 0. Null without `opensIn`.
 */
export function opensInSeconds(opensIn, receivedAt, now) {
  if (typeof opensIn !== "number" || !Number.isFinite(opensIn) || opensIn < 0) return null;
  return Math.max(0, Math.ceil((receivedAt + opensIn * 1000 - now) / 1000));
}

/** A countdown as m:ss (or h:mm:ss), for the READY pass and the retry timers. */
export function clock(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  const two = (n) => String(n).padStart(2, "0");
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h > 0 ? `${h}:${two(m)}:${two(s % 60)}` : `${m}:${two(s % 60)}`;
}

/** `template` with each `{name}` replaced by values[name]. */
export function fill(template, values) {
  return template.replace(/\{(\w+)\}/g, (whole, name) => (name in values ? String(values[name]) : whole));
}

/** The continue link's target: readyUrl with the token in the fragment (contract section 10). */
export function continueHref(readyUrl, token) {
  const base = readyUrl.split("#")[0];
  return `${base}#entry_token=${encodeURIComponent(token)}`;
}
