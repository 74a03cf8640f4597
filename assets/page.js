// The waiting page's behaviour: calls the room's endpoints, renders each answer into the
// `data-waitroom` hooks, schedules the next call. Every decision (state, delay, next call, wording
// of the wait) comes from poll.mjs, which page.rs inlines just before this file in the same
// <script type="module">; this file is therefore not a module of its own.
//
// Identity: the shop's authentication layer in front of the proxy adds it to every request from
// the browser (a header or a cookie), so the calls here only send the page's own cookies. Without
// one the proxy answers 401 and the page shows SIGN_IN (tools' identity-front plays that layer
// on a developer's machine).

const settings = JSON.parse(document.getElementById("waitroom-settings").textContent);
const texts = settings.texts;

/** A request that hangs this long counts as no answer, so the page never stalls. */
const REQUEST_TIMEOUT_MS = 15000;

/** After READY: ask once more this long after the pass ran out, to learn it is gone. */
const AFTER_EXPIRY_MS = 1000;

const TOKEN_KEY = "waitroom.token";

// A shop's own page (page.template_file) need hold only the state hook: every other one it
// leaves out is a detached element, written to and never shown.
const hook = (name) =>
  document.querySelector(`[data-waitroom="${name}"]`) ?? document.createElement(name === "progress" ? "progress" : "span");
const el = {
  heading: hook("heading"),
  state: hook("state"),
  message: hook("message"),
  line: hook("line"),
  position: hook("position"),
  eta: hook("eta"),
  progress: hook("progress"),
  updated: hook("updated"),
  ready: hook("ready"),
  expires: hook("expires"),
  continue: hook("continue"),
  retry: hook("retry"),
  enterAgain: hook("enter-again"),
  countdown: hook("countdown"),
  opensIn: hook("opens-in"),
  opensClock: hook("opens-clock"),
  announce: hook("announce"),
  signIn: hook("sign-in"),
  seed: hook("seed"),
  seedSha256: hook("seed-sha256"),
};

const timeFormat = new Intl.DateTimeFormat(settings.lang, { hour: "2-digit", minute: "2-digit", second: "2-digit" });

let state = null; // the last state shown, one of STATES
let pending = null; // { call, at, timer }: the scheduled next call
let expiresAt = null; // READY: when the pass runs out (ms since the epoch)
let opening = null; // NOT_OPEN, PREQUEUED: { opensIn, receivedAt }, for the countdown
let atEntry = null; // the position first seen in this stay in line, for the progress bar
let lastPosition = null;
let hasWaited = false; // a WAITING or READY answer was seen: NOT_IN_QUEUE then means a lost place
let lastAnnounced = "";
let generation = 0; // bumped by each call, so an answer overtaken by a newer call is dropped

async function request(call) {
  const controller = new AbortController();
  const abort = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
  try {
    const res = await fetch(`${settings.prefix}/${call}`, {
      method: call === "enter" ? "POST" : "GET",
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: "application/json" },
      signal: controller.signal,
    });
    let body = {};
    try {
      const parsed = await res.json();
      if (parsed && typeof parsed === "object") body = parsed;
    } catch {
      // Not JSON (an HTML error page from something in between): the status code decides.
    }
    return { httpStatus: res.status, retryAfter: parseRetryAfter(res.headers.get("Retry-After"), Date.now()), body };
  } catch {
    return { httpStatus: 0, retryAfter: null, body: {} };
  } finally {
    clearTimeout(abort);
  }
}

async function step(call) {
  cancelPending();
  const mine = ++generation;
  const answer = await request(call);
  if (mine !== generation) return;
  show(stateOf(answer), answer);
  const delay = nextDelay(answer, Math.random());
  const next = nextCall(answer, call);
  if (delay !== null && next !== null) schedule(next, delay);
  else if (state === "READY") schedule("status", passSeconds(answer.body) * 1000 + AFTER_EXPIRY_MS);
  tick();
  if (settings.event) showSeed();
}

let seedShown = false;

/** During a scheduled event: the committed hash of the draw's seed, for the user to keep and
 * check the draw with later (contract sections 10 and 14). Asked until the seed exists. */
async function showSeed() {
  if (seedShown) return;
  try {
    const res = await fetch(`${settings.prefix}/event`, { cache: "no-store", credentials: "same-origin" });
    const body = await res.json();
    if (typeof body.seedSha256 === "string" && /^[0-9a-f]{64}$/.test(body.seedSha256)) {
      el.seedSha256.textContent = body.seedSha256;
      el.seed.hidden = false;
      seedShown = true;
    }
  } catch {
    // Shown at a later answer.
  }
}

/** A READY answer's expiresIn, or a minute should it ever be missing (then ask again). */
function passSeconds(body) {
  return Number.isFinite(body.expiresIn) && body.expiresIn > 0 ? body.expiresIn : 60;
}

function schedule(call, delay) {
  cancelPending();
  pending = { call, at: Date.now() + delay, timer: setTimeout(() => step(call), delay) };
}

function cancelPending() {
  if (pending) clearTimeout(pending.timer);
  pending = null;
}

function show(next, answer) {
  const body = answer.body;
  const changed = next !== state;
  state = next;
  el.state.textContent = next;
  document.documentElement.dataset.waitroomState = next;
  el.heading.textContent = texts[`heading_${next}`];
  let message = texts[`message_${next}`];

  if (next === "WAITING") {
    hasWaited = true;
    forgetToken();
    const position = body.position;
    if (atEntry === null || position > atEntry) atEntry = position;
    const eta = etaText(body.estimatedWaitTime, texts);
    if (body.estimatedWaitTime === null) message = texts.message_PAUSED;
    el.position.textContent = String(position);
    el.eta.textContent = eta;
    el.progress.value = progressPercent(atEntry, position);
    el.progress.setAttribute("aria-valuetext", fill(texts.progress_value, { position }));
    document.title = fill(texts.title_waiting, { position });
    stamp();
    if (position !== lastPosition) announce(fill(texts.announce_position, { position, eta }));
    lastPosition = position;
  } else if (next === "READY") {
    hasWaited = true;
    rememberToken(body.token);
    el.continue.href = continueHref(settings.readyUrl, body.token);
    el.progress.value = 100;
    expiresAt = Date.now() + passSeconds(body) * 1000;
    document.title = texts.heading_READY;
    stamp();
  } else if (next === "NOT_IN_QUEUE") {
    if (hasWaited) message = texts.message_EXPIRED;
    forgetToken();
    atEntry = null;
    lastPosition = null;
    document.title = texts.title;
  }
  opening = BEFORE_OPENING.includes(next) ? { opensIn: body.opensIn, receivedAt: Date.now() } : null;
  el.countdown.hidden = opening === null;
  if (next === "SIGN_IN") {
    document.title = texts.heading_SIGN_IN;
  }
  el.signIn.hidden = !(next === "SIGN_IN" && settings.signInUrl);
  if (settings.signInUrl) el.signIn.href = settings.signInUrl;
  if (next === "CLOSED") {
    forgetToken();
    atEntry = null;
    lastPosition = null;
    document.title = texts.heading_CLOSED;
  }
  if (next !== "READY") {
    expiresAt = null;
    el.continue.removeAttribute("href");
  }

  el.message.textContent = message;
  const stillInLine = ["WAITING", "TOO_EARLY", "UNAVAILABLE"].includes(next);
  el.line.hidden = !(stillInLine && lastPosition !== null);
  el.ready.hidden = next !== "READY";
  el.continue.hidden = next !== "READY";
  el.enterAgain.hidden = next !== "NOT_IN_QUEUE";
  if (changed && next !== "WAITING") announce(sentences(el.heading.textContent, message));
}

/** Refreshes the countdowns; runs every second and after each answer. */
function tick() {
  const now = Date.now();
  const countsDown = ["FULL", "LIMITED", "UNAVAILABLE", "TOO_EARLY"].includes(state) && pending !== null;
  el.retry.hidden = !countsDown;
  if (countsDown) el.retry.textContent = fill(texts.retry, { time: clock((pending.at - now) / 1000) });
  if (opening !== null) {
    const seconds = opensInSeconds(opening.opensIn, opening.receivedAt, now);
    el.opensIn.textContent = seconds === null ? "" : String(seconds);
    el.opensClock.textContent = seconds === null ? "" : clock(seconds);
  }
  if (state === "READY" && expiresAt !== null) {
    el.expires.textContent = fill(texts.expires, { time: clock((expiresAt - now) / 1000) });
  }
}

function stamp() {
  const now = new Date();
  el.updated.dateTime = now.toISOString();
  el.updated.textContent = timeFormat.format(now);
}

/** Joins a heading and a message into what a screen reader says: "Heading. Message." */
function sentences(heading, message) {
  return /[.!?…。]$/.test(heading) ? `${heading} ${message}` : `${heading}. ${message}`;
}

function announce(text) {
  if (text === lastAnnounced) return;
  lastAnnounced = text;
  el.announce.textContent = text;
}

// sessionStorage can be unavailable (storage disabled, some private modes): the link's fragment
// still carries the token then.
function rememberToken(token) {
  try {
    sessionStorage.setItem(TOKEN_KEY, token);
  } catch {}
}

function forgetToken() {
  try {
    sessionStorage.removeItem(TOKEN_KEY);
  } catch {}
}

el.enterAgain.addEventListener("click", () => {
  atEntry = null;
  lastPosition = null;
  // The button hides itself; keep keyboard focus somewhere sensible.
  el.heading.focus();
  step("enter");
});

// Background tabs get their timers throttled; when the user looks again, do the due call now.
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && pending !== null && Date.now() >= pending.at) step(pending.call);
});

setInterval(tick, 1000);
// Always enter first: entering again never moves a waiting user back (contract section 3), so a
// reload keeps the place, and a user already READY gets the READY answer again.
step("enter");
