// The web console (served as /console.js: the Content-Security-Policy allows no inline
// script or style, so every element is built with the DOM API and styled by class or by
// CSSOM, never by markup). Plain JavaScript, no build step, nothing from another origin.
//
// Project and region come from the page's URL or are remembered in localStorage; the
// token is typed in, kept in sessionStorage (this tab only, gone when it closes) and never
// read from the URL. Pages are routed by the hash: #/jobs, #/jobs/ID, #/tuning,
// #/tuning/ID, #/pipelines, #/pipelines/ID, #/studies, #/experiments, #/experiments/NAME,
// #/nodes, #/nodes/NAME (and ?project=&region=
// in the hash switch to another project, for links to other projects' jobs).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------------------
// Errors: JavaScript errors, unhandled rejections and API errors go to the banner; a page
// that fails says so in its place, never leaving a blank page.

const bannerItems = new Map();
function showError(message, key, request) {
  key = key || message;
  message = String(message);
  for (const [k, v] of bannerItems) if (k === key || v.message === message) bannerItems.delete(k);
  bannerItems.set(key, { message, request, at: new Date() });
  while (bannerItems.size > 6) bannerItems.delete(bannerItems.keys().next().value);
  renderBanner();
}
function clearError(key) {
  if (bannerItems.delete(key)) renderBanner();
}
function renderBanner() {
  const list = $("banner-list");
  put(list, ...[...bannerItems.values()].map((e) => h("li", { title: e.request || null }, h("span", { class: "when" }, clock(e.at.getTime())), " ", e.message)));
  $("banner").hidden = bannerItems.size === 0;
}
$("banner-close").addEventListener("click", () => { bannerItems.clear(); renderBanner(); });
window.addEventListener("error", (ev) => {
  const where = ev.filename ? ` (${ev.filename.replace(location.origin, "")}:${ev.lineno})` : "";
  showError(`JavaScript error: ${ev.message}${where}`);
});
window.addEventListener("unhandledrejection", (ev) => {
  const r = ev.reason;
  if (r && r.name === "AbortError") return;
  showError(`Unhandled error: ${r && r.message ? r.message : r}`);
});

// ---------------------------------------------------------------------------------------
// DOM helpers.

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k.startsWith("on") && typeof v === "function") e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
}
function fill(e, kids) {
  for (const k of kids.flat(Infinity)) {
    if (k === null || k === undefined || k === false) continue;
    e.append(k instanceof Node ? k : String(k));
  }
  return e;
}
/** An HTML element: h("a", {href: "#/jobs"}, "Jobs"). */
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  return fill(e, kids);
}
/** An SVG element. */
function s(tag, attrs, ...kids) {
  const e = document.createElementNS(SVG_NS, tag);
  setAttrs(e, attrs);
  return fill(e, kids);
}
/** Replace an element's children (null and false are left out). */
function put(e, ...kids) {
  e.replaceChildren();
  return fill(e, kids);
}
const title = (text) => s("title", {}, text);

// ---------------------------------------------------------------------------------------
// Formatting.

const pad = (n, w = 2) => String(n).padStart(w, "0");
/** Local date and time of epoch milliseconds: 2026-11-30 14:05:03. */
function dateTime(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
/** Local clock time of epoch milliseconds, with milliseconds when asked: 14:05:03.092. */
function clock(ms, millis) {
  const d = new Date(ms);
  const t = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return millis ? `${t}.${pad(d.getMilliseconds(), 3)}` : t;
}
const parseTime = (iso) => (iso ? Date.parse(iso) : NaN);
/** A time cell: local time, the API's RFC 3339 text as its tooltip. */
function timeCell(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  return h("span", { title: iso }, dateTime(parseTime(iso)));
}
/** 850 ms, 12.3 s, 4m 05s, 2h 03m, 3d 04h. */
function duration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const sec = ms / 1000;
  if (sec < 60) return `${sec < 10 ? sec.toFixed(1) : Math.round(sec)} s`;
  const m = Math.floor(sec / 60), hr = Math.floor(m / 60), d = Math.floor(hr / 24);
  if (m < 60) return `${m}m ${pad(Math.floor(sec % 60))}s`;
  if (hr < 24) return `${hr}h ${pad(m % 60)}m`;
  return `${d}d ${pad(hr % 24)}h`;
}
/** Run time of a job, study or pipeline: start to end, or to now while it runs. */
function elapsed(r) {
  const start = parseTime(r.startTime);
  if (!Number.isFinite(start)) return "—";
  const end = r.endTime ? parseTime(r.endTime) : Date.now();
  return duration(end - start);
}
const shortState = (st) => String(st || "UNKNOWN").replace(/^(JOB_STATE_|PIPELINE_STATE_)/, "");
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "PARTIALLY_SUCCEEDED"]);
const isTerminal = (st) => TERMINAL.has(shortState(st));
function chip(state, extra) {
  const short = shortState(state);
  return h("span", { class: `st st-${short}${extra ? " " + extra : ""}`, title: state || "" }, short.replace(/_/g, " ").toLowerCase());
}
const lastSegment = (name) => String(name || "").split("/").pop();
const bytes = (n) => {
  n = Number(n);
  if (!Number.isFinite(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n >= 10 || i === 0 ? Math.round(n) : n.toFixed(1)} ${units[i]}`;
};
function num(v, digits = 4) {
  if (typeof v !== "number") return String(v ?? "—");
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 1000 || Math.abs(v) < 0.001 ? v.toPrecision(digits) : String(+v.toFixed(digits));
}

// ---------------------------------------------------------------------------------------
// Settings: project and region (localStorage, or the URL), the token (sessionStorage).

const params = new URLSearchParams(location.search);
// A token left in localStorage by an earlier console, or in the address bar, is dropped.
localStorage.removeItem("trainyard.token");
if (params.has("token")) {
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
}
const stores = { project: localStorage, region: localStorage, token: sessionStorage };
for (const [k, store] of Object.entries(stores)) {
  const v = (k === "token" ? null : params.get(k)) || store.getItem("trainyard." + k);
  if (v) $(k).value = v;
  $(k).addEventListener("change", () => {
    store.setItem("trainyard." + k, $(k).value.trim());
    if (k !== "token") remember(k, $(k).value.trim());
    settingsChanged(k);
  });
}
function remember(kind, value) {
  if (!value) return;
  const key = `trainyard.recent.${kind}s`;
  let list = [];
  try { list = JSON.parse(localStorage.getItem(key) || "[]"); } catch { list = []; }
  list = [value, ...list.filter((x) => x !== value)].slice(0, 12);
  localStorage.setItem(key, JSON.stringify(list));
  fillDatalist(kind);
}
const knownProjects = new Set();
function fillDatalist(kind) {
  let list = [];
  try { list = JSON.parse(localStorage.getItem(`trainyard.recent.${kind}s`) || "[]"); } catch { list = []; }
  const all = new Set([...list, ...(kind === "project" ? knownProjects : ["us-central1"])]);
  $(kind === "project" ? "projects" : "regions").replaceChildren(...[...all].map((v) => h("option", { value: v })));
}
remember("project", $("project").value);
remember("region", $("region").value);

const project = () => $("project").value.trim();
const region = () => $("region").value.trim();
const enc = encodeURIComponent;
/** `/v1/projects/{p}/locations/{l}`. */
const base = () => `/v1/projects/${enc(project())}/locations/${enc(region())}`;
const headers = () => ($("token").value ? { Authorization: "Bearer " + $("token").value } : {});

function settingsChanged(which) {
  // What went wrong with the earlier project, region or token no longer matters.
  bannerItems.clear();
  renderBanner();
  if (which === "token") return route();
  // A detail page belongs to its project: go to the list of its kind.
  const { parts } = parseHash();
  if (parts.length > 1 && parts[0] !== "nodes") location.hash = "#/" + parts[0];
  else route();
}

// ---------------------------------------------------------------------------------------
// The REST API.

/** A job error's code as a user reads it: its name and number ("INVALID_ARGUMENT (3)"). */
const CODE_NAMES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
  "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"];
function codeName(code) {
  if (code === undefined || code === null) return "Error";
  const name = CODE_NAMES[code];
  return name ? `${name} (${code})` : `Error ${code}`;
}

class ApiError extends Error {
  /** `message` in the API's words; `request` (`GET /v1/...`) for the banner's tooltip. */
  constructor(message, status, request) {
    super(message);
    this.status = status;
    this.request = request;
  }
}
/** An abort (the page was left) as fetch() itself says it. */
const aborted = () => new DOMException("The page was left.", "AbortError");
async function errorOf(r, method, path, signal) {
  const body = await r.json().catch(() => ({}));
  // An error answer whose page was left while its body came is no error of this page
  // (its reading was cut short: the body above is empty, not the API's words).
  if (signal && signal.aborted) return aborted();
  const e = body && body.error;
  let msg = e ? `${e.status || r.status}: ${e.message}` : `${r.status} ${r.statusText}`;
  if (r.status === 401 || r.status === 403) msg += " (check the token in the header)";
  return new ApiError(msg, r.status, `${method} ${path.replace(/\?.*/, "")}`);
}
/** A request to the API; the parsed JSON answer, or an ApiError in the API's words. */
async function api(path, opts = {}) {
  const method = opts.method || "GET";
  const init = { method, headers: headers(), signal: opts.signal };
  if (opts.body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof opts.body === "string" ? opts.body : JSON.stringify(opts.body);
  }
  const r = await fetch(path, init);
  if (!r.ok) throw await errorOf(r, method, path, opts.signal);
  return r.json();
}

/**
 * Read a newline-delimited JSON stream (the logs API) with fetch() and a ReadableStream:
 * `onEntries` gets each chunk's complete entries as they come; resolves when the stream
 * ends (with follow=true, when the job is terminal).
 */
async function streamNdjson(path, signal, onEntries) {
  const r = await fetch(path, { headers: headers(), signal });
  if (!r.ok) throw await errorOf(r, "GET", path, signal);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let rest = "";
  const parse = (lines) => {
    const out = [];
    for (const l of lines) {
      if (!l) continue;
      try { out.push(JSON.parse(l)); } catch { showError(`A log line is not JSON: ${l.slice(0, 120)}`, "log-json"); }
    }
    if (out.length) onEntries(out);
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    rest += decoder.decode(value, { stream: true });
    const cut = rest.lastIndexOf("\n");
    if (cut < 0) continue;
    const lines = rest.slice(0, cut).split("\n");
    rest = rest.slice(cut + 1);
    parse(lines);
  }
  rest += decoder.decode();
  parse(rest.split("\n"));
}
/** Every entry of a log request that ends by itself (no follow). */
async function readNdjson(path, signal) {
  const out = [];
  await streamNdjson(path, signal, (entries) => { for (const e of entries) out.push(e); });
  return out;
}

/**
 * Microseconds since the epoch of the logs API's RFC 3339 times (up to six fraction
 * digits). Finer than Date.parse, so that an event and a line of the same millisecond
 * are still put in order, and exact in a double (below 2^53).
 */
function micros(iso) {
  const m = /^(.+?)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$/.exec(iso || "");
  if (!m) return NaN;
  const ms = Date.parse(m[1] + m[3]);
  return ms * 1000 + (m[2] ? Number((m[2] + "00000").slice(0, 6)) : 0);
}
/** One log entry as text, to find it again in another answer of the logs API. */
const entryKey = (e) => `${e.time}|${e.attempt}|${e.replica}|${e.restart}|${e.stream}|${e.text}`;

// ---------------------------------------------------------------------------------------
// Hangs. The server watches the replicas of a job that asks for it ([lifecycle]
// hang_after_secs, label trainyard-hang-after-secs): one silent that long (no log line,
// checkpoint or metric file) is reported once, as a TY4 (or, beside replicas that go on, TY5) event of that replica in the
// job's log ("... it may be hung"). The CustomJob resource says nothing of it, so the
// console reads hangs from the log, by one rule for the jobs list and the job page:
//   a replica is hung while its TY4/TY5 report is the newest thing of it in the log (no line
//   of its own and no lifecycle event of it, such as a restart or an exit, came after)
//   and no later attempt of the job has begun.
// Metric-file and checkpoint writes end a hang for the server but are not in the log, so
// a replica that only writes those stays "hung" here until it prints or is restarted.

const HANG_LABEL = "trainyard-hang-after-secs";
const isHangReport = (e) => e.stream === "event" && (e.rule === "TY4" || e.rule === "TY5" || /^TY[45]: /.test(e.text || "")) && /may be hung|is a straggler/.test(e.text || "");
// The stack dump logged with a report is part of it, not a sign of life.
const isHangDump = (e) => e.stream === "event" && /processes when its silence was reported/.test(e.text || "");

/**
 * The replica's current hang from entries of its log (its lines and events, in any order;
 * the job's own events may be there too): {us, time, text, attempt} of its TY4/TY5 report, or
 * null.
 */
function currentHang(entries, replica) {
  let hang = null, last = -Infinity, attempt = -Infinity;
  for (const e of entries) {
    const a = Number(e.attempt) || 0;
    if (a > attempt) attempt = a;
    if (e.replica !== replica) continue;
    const us = micros(e.time);
    if (isHangReport(e)) {
      if (!hang || us > hang.us) hang = { us, time: e.time, text: String(e.text || ""), attempt: a };
    } else if (!isHangDump(e) && us > last) last = us;
  }
  return hang && hang.us > last && attempt <= hang.attempt ? hang : null;
}
/** A job's progress (trainyardProgress): a bar when the total is known, the step, the rate and the ETA. */
function progressBar(p, long) {
  const step = Number(p.step), total = p.total ? Number(p.total) : null;
  const text = [total ? `${fmtCount(step)} / ${fmtCount(total)}` : `step ${fmtCount(step)}`,
    long && p.stepsPerSecond != null ? `${p.stepsPerSecond} steps/s` : null,
    long && p.eta ? `ETA ${dateTime(Date.parse(p.eta))}` : null].filter(Boolean).join(" · ");
  const bar = total ? h("span", { class: "bar progress-bar", title: text }, widthOf(h("span", { class: "fill" }), Math.min(100, (100 * step) / total))) : null;
  return h("span", { class: "job-progress", title: text }, bar, " ", h("span", { class: "small" }, text));
}
/** An element `pct` percent wide (set through the CSSOM: the page's CSP refuses style attributes). */
function widthOf(e, pct) {
  e.style.width = `${pct.toFixed(1)}%`;
  return e;
}
/** Where a job's time went (trainyardGoodput): its wall time by kind as one bar, and the
 * share that was productive; accelerator time in the title when the job holds GPUs. */
function goodputBar(g) {
  const kinds = ["productive", "idle", "lost", "starting", "queued"];
  const w = g.wallSeconds || {}, a = g.acceleratorSeconds || {};
  const total = kinds.reduce((sum, k) => sum + (w[k] || 0), 0);
  if (!total) return null;
  const part = (o) => kinds.filter((k) => o[k]).map((k) => `${k} ${duration(o[k] * 1000)}`).join(" · ");
  const gpu = kinds.some((k) => a[k]) ? `\nGPU time: ${part(a)}` : "";
  const text = `${Math.round((g.goodput || 0) * 100)}% productive · ${part(w)}`;
  const bar = h("span", { class: "bar goodput-bar", title: text + gpu },
    kinds.map((k) => widthOf(h("span", { class: `seg seg-${k}` }), (100 * (w[k] || 0)) / total)));
  return h("span", { class: "goodput", id: "goodput" }, bar, " ", h("span", { class: "small" }, text));
}
/** A "hang" badge for replicas hung now ([{replica, hang}]); null when none is. */
function hangBadge(hung, extra) {
  if (!hung || !hung.length) return null;
  const tip = hung.map(({ replica, hang }) => `${replica}: reported hung at ${dateTime(hang.us / 1000)}, nothing from it since\n${hang.text}`).join("\n\n");
  return h("span", { class: "hang-badge" + (extra ? " " + extra : ""), title: tip, "data-replicas": hung.map((x) => x.replica).join(" ") }, "hang");
}

// ---------------------------------------------------------------------------------------
// Routing and the life of a page: a page's requests are aborted and its timers stopped
// when another page is shown.

let page = null;
function newPage() {
  if (page) {
    page.ac.abort();
    page.timers.forEach(clearInterval);
    page.cleanups.forEach((f) => f());
  }
  page = { ac: new AbortController(), timers: [], cleanups: [] };
  page.signal = page.ac.signal;
  return page;
}
/** Run `fn` every `ms` while the page is shown and the tab visible. */
function every(pg, ms, fn) {
  let busy = false;
  pg.timers.push(setInterval(async () => {
    if (busy || document.hidden || pg.signal.aborted) return;
    busy = true;
    try { await fn(); } catch (e) { report(e); } finally { busy = false; }
  }, ms));
}
/** An error for the banner (aborted requests are not errors). */
function report(e, key) {
  if (!e || e.name === "AbortError") return;
  showError(e.message || String(e), key, e.request);
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const i = raw.indexOf("?");
  const path = i < 0 ? raw : raw.slice(0, i);
  const q = new URLSearchParams(i < 0 ? "" : raw.slice(i + 1));
  let parts = [];
  try { parts = path.split("/").filter(Boolean).map(decodeURIComponent); } catch { parts = path.split("/").filter(Boolean); }
  return { parts, q };
}
function hashWith(parts, q) {
  const qs = q && q.toString();
  return "#/" + parts.map(enc).join("/") + (qs ? "?" + qs : "");
}
/** A link to a resource by its full name, switching project and region when they differ. */
function resourceHref(name) {
  const m = /^projects\/([^/]+)\/locations\/([^/]+)\/(customJobs|hyperparameterTuningJobs|trainingPipelines)\/([^/]+)$/.exec(name || "");
  if (!m) return null;
  const section = { customJobs: "jobs", hyperparameterTuningJobs: "tuning", trainingPipelines: "pipelines" }[m[3]];
  const q = new URLSearchParams();
  if (m[1] !== project()) q.set("project", m[1]);
  if (m[2] !== region()) q.set("region", m[2]);
  return hashWith([section, m[4]], q);
}
/** `projects/P/locations/L/customJobs/7` as a user reads it: `customJobs/7 (P)`; the
 *  full name stays in the link's title. */
function shortJob(name) {
  const m = /^projects\/([^/]+)\/locations\/[^/]+\/(.+)$/.exec(name || "");
  return m ? `${m[2]} (${m[1]})` : name;
}

function resourceLink(name, text) {
  const href = resourceHref(name);
  return href ? h("a", { href }, text || name) : h("span", {}, text || name || "—");
}

const view = $("view");
async function route() {
  const pg = newPage();
  let { parts, q } = parseHash();
  // ?project= and ?region= in the hash switch the selectors, then leave the address.
  let switched = false;
  for (const k of ["project", "region"]) {
    const v = q.get(k);
    if (v !== null) {
      q.delete(k);
      if (v && v !== $(k).value) { $(k).value = v; stores[k].setItem("trainyard." + k, v); remember(k, v); }
      switched = true;
    }
  }
  if (switched) history.replaceState(null, "", location.pathname + location.search + hashWith(parts, q));
  const [section = "jobs", id] = parts;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.section === (section === "queue" ? "nodes" : section));
  const pages = {
    jobs: id ? (parts[2] === "terminal" ? () => terminalPage(pg, id, parts[3] || "workerpool0-0") : () => jobPage(pg, id)) : () => jobsList(pg, q),
    tuning: id ? () => studyPage(pg, id) : () => tuningList(pg, q),
    pipelines: id ? () => pipelinePage(pg, id) : () => pipelinesList(pg, q),
    studies: id ? () => vizierStudyPage(pg, id) : () => vizierStudiesList(pg),
    experiments: id ? () => experimentPage(pg, id) : () => experimentsList(pg),
    nodes: id ? () => nodePage(pg, id) : () => nodesPage(pg),
    queue: () => nodesPage(pg),
  };
  const show = pages[section];
  put(view);
  if (!show) {
    document.title = "Trainyard";
    view.append(h("section", { class: "card" }, h("h2", {}, "No such page"), h("p", {}, `There is no page "${location.hash}". `, h("a", { href: "#/jobs" }, "Show the jobs."))));
    return;
  }
  try {
    await show();
  } catch (e) {
    if (e && e.name === "AbortError") return;
    // Said once: on the page's own card when the page is still shown, else in the banner.
    if (pg !== page) { report(e); return; }
    {
      view.append(h("section", { class: "card failed" }, h("h2", {}, "This page could not be shown"), h("p", { class: "errtext" }, e && e.message ? e.message : String(e)),
        h("p", {}, h("button", { type: "button", onclick: () => route() }, "Try again"))));
    }
  }
}
window.addEventListener("hashchange", route);

// ---------------------------------------------------------------------------------------
// Lists: filter box, paging with pageToken/nextPageToken.

/**
 * A paged table of one collection. `path()` is the list URL without pageToken; rows are
 * made by `columns`; `after(items)`, when given, sees each page shown. Returns {el, load}:
 * `load()` reads the current page again (for the periodic refresh), `load(true)` goes
 * back to the first page.
 */
/**
 * A list's failure is said in its table (by `pagedTable`), not again in the banner; but a
 * missing or refused token is the header's business, said in the banner for every page.
 */
const saidInTable = (e) => {
  if (e && (e.status === 401 || e.status === 403)) report(e, "list");
};

function pagedTable(pg, { path, collection, columns, href, empty, after }) {
  const tbody = h("tbody");
  const info = h("span", { class: "muted" });
  const prev = h("button", { type: "button", class: "prev", disabled: true }, "‹ Newer");
  const next = h("button", { type: "button", class: "next", disabled: true }, "Older ›");
  const tokens = [""];
  let at = 0, nextToken = null;
  const el = h("div", {},
    h("table", { class: "list" }, h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.cls }, c.h)))), tbody),
    h("div", { class: "pager" }, prev, info, next));
  async function load(first) {
    try {
      await read(first);
    } catch (e) {
      // The table says why it is empty (the caller need not say it again).
      if (e.name !== "AbortError") {
        put(tbody, h("tr", {}, h("td", { colspan: columns.length, class: "errtext empty" }, e.message)));
        prev.disabled = next.disabled = true;
        info.textContent = "";
      }
      throw e;
    }
  }
  async function read(first) {
    if (first) { tokens.length = 1; at = 0; }
    const token = tokens[at];
    const body = await api(path() + (token ? "&pageToken=" + enc(token) : ""), { signal: pg.signal });
    const items = body[collection] || [];
    nextToken = body.nextPageToken || null;
    put(tbody, ...items.map((r) => {
      const tr = h("tr", { class: "row", "data-name": r.name }, columns.map((c) => h("td", { class: c.cls }, c.cell(r))));
      const to = href(r);
      if (to) tr.addEventListener("click", (ev) => { if (!ev.target.closest("a, button")) location.hash = to; });
      return tr;
    }));
    if (!items.length) tbody.append(h("tr", {}, h("td", { colspan: columns.length, class: "muted empty" }, at ? "No more items." : empty)));
    prev.disabled = at === 0;
    next.disabled = !nextToken;
    info.textContent = `page ${at + 1} · ${items.length} shown${nextToken ? " · more on the next pages" : ""}`;
    clearError("list");
    if (after) after(items);
  }
  prev.addEventListener("click", () => { if (at > 0) { at--; load().catch(saidInTable); } });
  next.addEventListener("click", () => {
    if (!nextToken) return;
    tokens[at + 1] = nextToken;
    at++;
    load().catch(saidInTable);
  });
  return { el, load };
}

/** The AIP-160 filter box; submitting puts the filter in the address (#/jobs?filter=...). */
function filterBox(q, section, examples, stateExample) {
  const input = h("input", { type: "search", class: "filter", name: "filter", value: q.get("filter") || "", placeholder: examples, size: 60, spellcheck: "false", autocomplete: "off" });
  const form = h("form", { class: "toolbar", onsubmit: (ev) => {
    ev.preventDefault();
    const nq = new URLSearchParams(q);
    if (input.value.trim()) nq.set("filter", input.value.trim()); else nq.delete("filter");
    location.hash = hashWith([section], nq);
  } },
  h("label", {}, "Filter ", input), h("button", { type: "submit" }, "Apply"),
  q.get("filter") ? h("a", { href: hashWith([section], new URLSearchParams([...q].filter(([k]) => k !== "filter"))) }, "clear") : null,
  h("span", { class: "muted hint", title: "The filter language of the API (AIP-160)" }, "For example: ", stateExample === false ? null : [h("code", {}, 'state="JOB_STATE_RUNNING"'), ", "], h("code", {}, 'display_name:"x"'), ", ", h("code", {}, 'create_time>"2026-01-01T00:00:00Z"'), ", ", h("code", {}, 'labels.team="a"'), ", AND OR NOT"));
  return form;
}

// ---------------------------------------------------------------------------------------
// CustomJobs: the list with state counts.

const JOB_STATES = ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLING", "CANCELLED", "PAUSED", "EXPIRED", "UPDATING", "PARTIALLY_SUCCEEDED"];
const COUNT_PAGES = 20;

async function jobsList(pg, q) {
  document.title = "Jobs · Trainyard";
  const typed = (q.get("filter") || "").trim();
  // Tuning trials (label trainyard_study) are left out unless asked for: they crowd the
  // list (a study's page lists its own).
  const hideTrials = q.get("trials") !== "show";
  const noTrials = "NOT labels.trainyard_study:*";
  const userFilter = hideTrials ? (typed ? `${noTrials} AND (${typed})` : noTrials) : typed;
  const state = (q.get("state") || "").toUpperCase().replace(/^JOB_STATE_/, "");
  const stateFilter = state ? `state="JOB_STATE_${state}"` : "";
  const filter = stateFilter && userFilter ? `${stateFilter} AND (${userFilter})` : stateFilter || userFilter;
  const trialsToggle = h("label", { class: "muted small", id: "hide-trials" }, h("input", { type: "checkbox", checked: hideTrials ? "" : null, onchange: (ev) => {
    const nq = new URLSearchParams(q);
    if (ev.target.checked) nq.delete("trials"); else nq.set("trials", "show");
    location.hash = hashWith(["jobs"], nq);
  } }), " hide tuning trials");
  const chips = h("div", { class: "chips", id: "state-chips" }, h("span", { class: "muted" }, "counting…"));
  const hangs = jobHangs(pg);
  const table = pagedTable(pg, {
    path: () => base() + "/customJobs?pageSize=100" + (filter ? "&filter=" + enc(filter) : ""),
    collection: "customJobs",
    href: (j) => hashWith(["jobs", lastSegment(j.name)]),
    empty: typed || state ? "No job matches this filter." : `No jobs in project ${project()} (${region()}).`,
    after: (items) => hangs.check(items),
    columns: [
      { h: "Name", cls: "id", cell: (j) => h("a", { href: hashWith(["jobs", lastSegment(j.name)]), title: j.name }, lastSegment(j.name)) },
      { h: "Display name", cell: (j) => j.displayName || "" },
      { h: "State", cell: (j) => [chip(j.state), hangs.slot(j), j.trainyardWaitingReason ? h("div", { class: "why", title: j.trainyardWaitingReason }, j.trainyardWaitingReason) : null,
        j.trainyardProgress && shortState(j.state) === "RUNNING" ? h("div", {}, progressBar(j.trainyardProgress, false)) : null] },
      { h: "Created", cls: "time", cell: (j) => timeCell(j.createTime) },
      { h: "Started", cls: "time", cell: (j) => timeCell(j.startTime) },
      { h: "Ended", cls: "time", cell: (j) => timeCell(j.endTime) },
      { h: "Elapsed", cls: "num", cell: (j) => elapsed(j) },
    ],
  });
  view.append(h("section", { class: "card" },
    h("h2", {}, "Custom jobs ", h("span", { class: "muted small" }, `${project()} · ${region()}`)),
    filterBox(q, "jobs", 'e.g. state="JOB_STATE_RUNNING" AND display_name:"resnet"'),
    trialsToggle,
    chips,
    filter ? h("p", { class: "muted small" }, "Filter sent: ", h("code", { id: "filter-sent" }, filter)) : null,
    table.el));

  /** Counts per state of the jobs the text filter selects (all pages, state only). */
  async function count() {
    const counts = new Map();
    let token = "", pages = 0, total = 0, capped = false;
    do {
      const body = await api(base() + "/customJobs?pageSize=1000&readMask=state" + (userFilter ? "&filter=" + enc(userFilter) : "") + (token ? "&pageToken=" + enc(token) : ""), { signal: pg.signal });
      for (const j of body.customJobs || []) {
        const st = shortState(j.state);
        counts.set(st, (counts.get(st) || 0) + 1);
        total++;
      }
      token = body.nextPageToken || "";
      pages++;
      if (token && pages >= COUNT_PAGES) { capped = true; break; }
    } while (token);
    const plus = capped ? "+" : "";
    const mk = (st, n, label) => {
      const nq = new URLSearchParams(q);
      if (st && st !== state) nq.set("state", st); else nq.delete("state");
      return h("a", { class: `chip ${st ? "st-" + st : "all"}${(st || "") === state ? " on" : ""}${n ? "" : " zero"}`, href: hashWith(["jobs"], nq), "data-state": st || "ALL",
        title: st ? `Show only ${st.toLowerCase()} jobs${st === state ? " (click again for all)" : ""}` : "Show jobs of every state" }, label, " ", h("b", {}, `${n}${plus}`));
    };
    const known = [...JOB_STATES, ...[...counts.keys()].filter((k) => !JOB_STATES.includes(k))];
    put(chips, mk("", total, "All"), ...known.filter((st) => counts.get(st) || st === state).map((st) => mk(st, counts.get(st) || 0, st.replace(/_/g, " ").toLowerCase())),
      capped ? h("span", { class: "muted small" }, ` (counted the newest ${COUNT_PAGES * 1000})`) : null);
  }
  // The list's own failure (a bad filter, a server gone) is said once, in the table.
  await table.load(true).catch(saidInTable);
  count().catch(() => put(chips, h("span", { class: "muted" }, "counts unavailable")));
  every(pg, 3000, () => table.load().catch(saidInTable));
  every(pg, 10000, count);
}

/**
 * The jobs list's "hang" badges: RUNNING jobs of the page shown are looked at, each
 * replica by the end of its own log (`logs?replica=R&tail=20`), under the rule above.
 * A job is looked at again only when its updateTime moved (a hang report, a restart, an
 * exit all change the job, L2), or while it is shown hung, at most every HANG_RECHECK_MS
 * (a hung replica that prints again does not change the job: once it has reported a
 * replica, the server no longer looks at its writes until another deadline of the job).
 * A list of quiet jobs costs no log reads after the first look. Four requests at a time.
 */
const HANG_RECHECK_MS = 8000;
const HANG_TAIL = 20;
function jobHangs(pg) {
  const known = new Map(); // job name -> {updateTime, at (ms), hung: [{replica, hang}]}
  const busy = new Set();
  let queue = [], running = 0;
  const slot = (j) => {
    const k = known.get(j.name);
    return h("span", { class: "hang-slot" }, shortState(j.state) === "RUNNING" && k ? hangBadge(k.hung) : null);
  };
  function show(j) {
    const tr = [...document.querySelectorAll("table.list tr.row")].find((r) => r.dataset.name === j.name);
    const old = tr && tr.querySelector(".hang-slot");
    if (old) old.replaceWith(slot(j));
  }
  async function look(j) {
    const path = `/v1/${j.name}/logs?tail=${HANG_TAIL}&replica=`;
    const hung = [];
    for (const replica of replicasOf(j.jobSpec)) {
      const hang = currentHang(await readNdjson(path + enc(replica), pg.signal), replica);
      if (hang) hung.push({ replica, hang });
    }
    known.set(j.name, { updateTime: j.updateTime, at: Date.now(), hung });
    show(j);
  }
  function pump() {
    while (running < 4 && queue.length) {
      const j = queue.shift();
      running++;
      look(j).catch((e) => report(e, "hangs")).finally(() => { running--; busy.delete(j.name); pump(); });
    }
  }
  function check(items) {
    for (const j of items) {
      if (shortState(j.state) !== "RUNNING") { known.delete(j.name); continue; }
      const k = known.get(j.name);
      const stale = !k || k.updateTime !== j.updateTime || (k.hung.length && Date.now() - k.at >= HANG_RECHECK_MS);
      if (stale && !busy.has(j.name)) { busy.add(j.name); queue.push(j); }
    }
    pump();
  }
  return { check, slot };
}

// ---------------------------------------------------------------------------------------
// A CustomJob: fields, timeline, transitions, live logs, cancel.

/** A "Cancel" button that asks for confirmation in the page before it POSTs :cancel. */
function cancelControl(pg, { path, what, isDone, after }) {
  const button = h("button", { type: "button", class: "danger", id: "cancel" }, `Cancel ${what}…`);
  const box = h("div", { class: "confirm", id: "cancel-confirm", hidden: true });
  const sync = (done) => { button.disabled = !!done; if (done) box.hidden = true; };
  button.addEventListener("click", () => {
    put(box, 
      h("span", {}, `Cancel this ${what}? Running replicas are stopped (SIGTERM, then SIGKILL after the grace period); this cannot be undone.`),
      h("button", { type: "button", class: "danger", id: "cancel-yes", onclick: async () => {
        put(box, h("span", {}, "Cancelling…"));
        try {
          await api(`/v1/${path}:cancel`, { method: "POST", body: "{}", signal: pg.signal });
          box.hidden = true;
          await after();
        } catch (e) {
          report(e);
          box.hidden = true;
        }
      } }, `Yes, cancel the ${what}`),
      h("button", { type: "button", id: "cancel-no", onclick: () => { box.hidden = true; } }, "No, keep it"));
    box.hidden = false;
  });
  sync(isDone);
  return { el: h("div", { class: "actions" }, button, box), sync };
}

/** A definition list of [label, value] pairs (values may be nodes); empty values skipped. */
function fields(pairs) {
  return h("dl", { class: "fields" }, pairs.filter(([, v]) => v !== undefined && v !== null && v !== "").map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}
function errorBlock(err) {
  if (!err) return null;
  // Code 1 (CANCELLED) is how a cancelled job ends, not a failure.
  return h("div", { class: err.code === 1 ? "error-block neutral" : "error-block", id: "job-error" }, h("b", {}, `${codeName(err.code)}: `), h("pre", { class: "errtext" }, err.message || JSON.stringify(err)));
}
// ---------------------------------------------------------------------------------------
// A terminal in a running replica (#/jobs/ID/terminal/REPLICA): xterm.js (served from
// /vendor, with its licence) on the session WebSocket of `custom-jobs exec` (docs/exec.md:
// channel 0 input, 1 output, 3 the end, 4 the size). A browser's WebSocket can send no
// Authorization header: the token goes as a subprotocol, `bearer.<base64url>`.

/** xterm.js, loaded once; the style elements it makes carry the page's nonce (CSP). */
let xtermLoaded = null;
function loadXterm() {
  if (xtermLoaded) return xtermLoaded;
  const nonce = (document.querySelector('meta[name="trainyard-style-nonce"]') || {}).content || "";
  const create = document.createElement.bind(document);
  document.createElement = (tag, opts) => {
    const el = create(tag, opts);
    if (String(tag).toLowerCase() === "style" && nonce) el.nonce = nonce;
    return el;
  };
  document.head.append(h("link", { rel: "stylesheet", href: "/vendor/xterm.css" }));
  xtermLoaded = new Promise((resolve, reject) => {
    const s = h("script", { src: "/vendor/xterm.js" });
    s.addEventListener("load", () => (window.Terminal ? resolve(window.Terminal) : reject(new Error("xterm.js did not load"))));
    s.addEventListener("error", () => { xtermLoaded = null; reject(new Error("xterm.js could not be loaded from /vendor/xterm.js")); });
    document.head.append(s);
  });
  return xtermLoaded;
}
function b64url(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
async function terminalPage(pg, id, replica) {
  const name = `projects/${project()}/locations/${region()}/customJobs/${id}`;
  document.title = `${replica} of job ${id} · Trainyard`;
  const status = h("span", { class: "stream-status", id: "terminal-status" }, "connecting…");
  const box = h("div", { class: "terminal-box", id: "terminal" });
  view.append(
    h("div", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", h("a", { href: `#/jobs/${enc(id)}` }, id), " / ", replica),
    h("section", { class: "card" }, h("div", { class: "head" }, h("h3", {}, `Terminal in ${replica}`), status),
      h("p", { class: "small muted" }, `A shell inside the replica's sandbox, as trainyard custom-jobs exec ${id} --replica ${replica} gives; it ends with the replica, or after the server's idle timeout.`),
      box));
  const Terminal = await loadXterm();
  if (pg.signal.aborted) return;
  const term = new Terminal({ cols: 120, rows: 32, convertEol: false, cursorBlink: true, scrollback: 5000, fontSize: 13 });
  term.open(box);
  window.trainyardTerminal = term;
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const q = new URLSearchParams({ replica, tty: "true", cols: String(term.cols), rows: String(term.rows), term: "xterm-256color" });
  const protocols = ["trainyard.v1"];
  if ($("token").value) protocols.push("bearer." + b64url($("token").value));
  const ws = new WebSocket(`${proto}//${location.host}/v1/${name}/exec?${q}`, protocols);
  ws.binaryType = "arraybuffer";
  const send = (channel, bytes) => {
    if (ws.readyState !== WebSocket.OPEN) return;
    const msg = new Uint8Array(bytes.length + 1);
    msg[0] = channel;
    msg.set(bytes, 1);
    ws.send(msg);
  };
  const enc8 = new TextEncoder();
  const dataSub = term.onData((d) => send(0, enc8.encode(d)));
  const binSub = term.onBinary((d) => send(0, Uint8Array.from(d, (c) => c.charCodeAt(0) & 255)));
  const resizeSub = term.onResize(({ cols, rows }) => send(4, enc8.encode(JSON.stringify({ cols, rows }))));
  let ended = false;
  ws.addEventListener("open", () => { put(status, "connected"); status.className = "stream-status live"; term.focus(); });
  ws.addEventListener("message", (ev) => {
    const m = new Uint8Array(ev.data);
    if (!m.length) return;
    if (m[0] === 1 || m[0] === 2) term.write(m.subarray(1));
    else if (m[0] === 3) {
      ended = true;
      let end = {};
      try { end = JSON.parse(new TextDecoder().decode(m.subarray(1))); } catch (_) { /* said below */ }
      const said = end.error ? `${end.error.status}: ${end.error.message}` : end.signal ? `ended by signal ${end.signal}` : `exited with status ${end.exitStatus}`;
      put(status, "ended: " + said);
      status.className = "stream-status " + (end.error || end.exitStatus ? "broken" : "done");
    }
  });
  ws.addEventListener("close", () => {
    if (!ended) { put(status, "the connection was closed (see the banner)"); status.className = "stream-status broken"; }
  });
  ws.addEventListener("error", () => {
    // The handshake's answer is not readable from a page: ask the API why.
    api(`/v1/${name}`, { signal: pg.signal }).then((job) => {
      if (shortState(job.state) !== "RUNNING") report(new Error(`Job ${id} is ${shortState(job.state)}: a terminal needs a running replica.`));
      else report(new Error(`The terminal in ${replica} could not be opened (a read-write token of the project is needed).`));
    }).catch(report);
  });
  pg.cleanups.push(() => { dataSub.dispose(); binSub.dispose(); resizeSub.dispose(); ws.close(); term.dispose(); delete window.trainyardTerminal; });
}

function poolsTable(spec) {
  const pools = (spec && spec.workerPoolSpecs) || [];
  if (!pools.length) return null;
  return h("table", { class: "list pools" },
    h("thead", {}, h("tr", {}, ["Pool", "Replicas", "Machine type", "Accelerators", "Disk", "Program"].map((x) => h("th", {}, x)))),
    h("tbody", {}, pools.map((p, i) => {
      const m = p.machineSpec || {};
      const c = p.containerSpec, py = p.pythonPackageSpec;
      const prog = c ? [c.imageUri, (c.command || []).join(" "), (c.args || []).join(" ")].filter(Boolean).join("  ")
        : py ? [py.executorImageUri, py.pythonModule, (py.args || []).join(" ")].filter(Boolean).join("  ") : "";
      const disk = p.diskSpec ? `${p.diskSpec.bootDiskSizeGb || "?"} GB ${p.diskSpec.bootDiskType || ""}` : "";
      return h("tr", {}, h("td", {}, `workerpool${i}`), h("td", { class: "num" }, p.replicaCount || "0"), h("td", {}, m.machineType || "—"),
        h("td", {}, m.acceleratorType && m.acceleratorType !== "ACCELERATOR_TYPE_UNSPECIFIED" ? `${m.acceleratorCount || 1} × ${m.acceleratorType}` : "—"),
        h("td", {}, disk), h("td", { class: "prog", title: prog }, prog));
    })));
}
function replicasOf(spec) {
  const out = [];
  ((spec && spec.workerPoolSpecs) || []).forEach((p, i) => {
    const n = Math.min(Number(p.replicaCount || 0), 64);
    for (let k = 0; k < n; k++) out.push(`workerpool${i}-${k}`);
  });
  return out;
}
/** Sort replica names naturally: service first, workerpool0-0, workerpool1-0, workerpool1-10. */
function replicaOrder(a, b) {
  if (a === b) return 0;
  if (a === "service") return -1;
  if (b === "service") return 1;
  const ma = /^workerpool(\d+)-(\d+)$/.exec(a), mb = /^workerpool(\d+)-(\d+)$/.exec(b);
  if (ma && mb) return (ma[1] - mb[1]) || (ma[2] - mb[2]);
  return a < b ? -1 : 1;
}

/** How many of the newest log lines the job page opens on (0: the whole log). */
const LOG_TAILS = [200, 1000, 5000, 20000, 0];
const LOG_TAIL_DEFAULT = 1000;
function logTail() {
  const v = localStorage.getItem("trainyard.logTail");
  if (v === "all") return 0;
  const n = Number(v);
  return n > 0 && LOG_TAILS.includes(n) ? n : LOG_TAIL_DEFAULT;
}
/** The most entries one `tail` of the logs API gives (the server's limit). */
const MAX_TAIL = 100000;
const fmtCount = (n) => Number(n).toLocaleString("en-US");

/**
 * Where the run of entries `head` begins in `list`, at index `maxAt` or before: the latest
 * such place, or -1. Its first 8 entries must match; failing that, its first one (two
 * answers of the logs API may interleave replicas' lines of the same moment differently).
 */
function findRun(list, head, maxAt) {
  if (!head.length) return -1;
  const keys = head.map(entryKey);
  for (const k of [Math.min(8, keys.length), 1]) {
    for (let i = Math.min(maxAt, list.length - k); i >= 0; i--) {
      let ok = true;
      for (let j = 0; j < k && ok; j++) ok = entryKey(list[i + j]) === keys[j];
      if (ok) return i;
    }
  }
  return -1;
}

async function jobPage(pg, id) {
  const name = `projects/${project()}/locations/${region()}/customJobs/${id}`;
  const path = `/v1/${name}`;
  document.title = `Job ${id} · Trainyard`;
  let job = await api(path, { signal: pg.signal });

  const heading = h("h2", {});
  const hangSlot = h("span", { id: "hang-slot" });
  const hangBox = h("div", { id: "job-hang" });
  const summary = h("div", {});
  const cancel = cancelControl(pg, { path: name, what: "job", isDone: isTerminal(job.state) || shortState(job.state) === "CANCELLING", after: () => refresh() });
  const timelineBox = h("div", { class: "timeline-box", id: "timeline" });
  const legend = h("div", { class: "legend" });
  const transitions = h("tbody");
  const transitionsCount = h("span", {});
  const replicaSelect = h("select", { id: "replica-filter" }, h("option", { value: "" }, "all replicas"));
  const status = h("span", { class: "stream-status", id: "log-status" }, "connecting…");
  const logEl = h("div", { class: "log", id: "log", tabindex: "0" });
  const toggles = ["stdout", "stderr", "event"].map((k) => {
    const box = h("input", { type: "checkbox", checked: true, "data-stream": k });
    box.addEventListener("change", () => logEl.classList.toggle("hide-" + k, !box.checked));
    return h("label", { class: "toggle" }, box, ` ${k === "event" ? "events" : k}`);
  });
  const bottom = h("button", { type: "button", title: "Scroll to the newest line and follow it" }, "Follow ↓");
  bottom.addEventListener("click", () => { logEl.scrollTop = logEl.scrollHeight; });
  // How many of the newest lines the pane opens on; a change opens the page again.
  const tailN = logTail();
  const tailSelect = h("select", { id: "log-tail", title: "How many of the newest lines the log opens on (earlier ones: \"Load earlier\" at its top)" },
    LOG_TAILS.map((n) => h("option", { value: n ? String(n) : "all", selected: n === tailN }, n ? `last ${fmtCount(n)} lines` : "whole log")));
  tailSelect.addEventListener("change", () => { localStorage.setItem("trainyard.logTail", tailSelect.value); route(); });

  view.append(
    h("div", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", id),
    h("section", { class: "card" }, h("div", { class: "head" }, heading, cancel.el), hangBox, summary),
    h("section", { class: "card" }, h("h3", {}, "Timeline"), timelineBox, legend,
      h("details", { class: "transitions" }, h("summary", {}, "Transitions ", transitionsCount),
        h("div", { class: "scroll" }, h("table", { class: "list" }, h("thead", {}, h("tr", {}, ["Time", "After create", "Attempt", "Replica", "Rule", "What happened"].map((x) => h("th", {}, x)))), transitions)))),
    h("section", { class: "card" }, h("div", { class: "head" }, h("h3", {}, "Logs"),
      h("div", { class: "logbar" }, h("label", {}, "Replica ", replicaSelect), h("label", {}, "Open on ", tailSelect), toggles, bottom, status)), logEl));

  function showJob() {
    put(heading, job.displayName || `Job ${id}`, " ", chip(job.state, "big"), " ", hangSlot);
    const spec = job.jobSpec || {};
    const sched = spec.scheduling || {};
    put(summary, 
      fields([
        ["Name", h("code", {}, job.name)],
        ["State", chip(job.state)],
        ["Waiting", job.trainyardWaitingReason ? h("span", { class: "why-full" }, job.trainyardWaitingReason) : null],
        ["Created", timeCell(job.createTime)],
        ["Started", timeCell(job.startTime)],
        ["Ended", timeCell(job.endTime)],
        ["Elapsed", elapsed(job)],
        ["Progress", job.trainyardProgress ? progressBar(job.trainyardProgress, true) : null],
        ["Goodput", job.trainyardGoodput ? goodputBar(job.trainyardGoodput) : null],
        ["Health", job.trainyardHealth && job.trainyardHealth.state !== "ok" ? h("span", { class: "hang-text" }, `${job.trainyardHealth.state}: ${job.trainyardHealth.replica} since ${dateTime(Date.parse(job.trainyardHealth.since))}`) : null],
        ["Labels", job.labels && Object.keys(job.labels).length ? Object.entries(job.labels).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`)) : null],
        ["Terminal", shortState(job.state) === "RUNNING" ? replicasOf(spec).map((r) => h("a", { class: "terminal-link", href: `#/jobs/${enc(id)}/terminal/${enc(r)}`, title: `A shell in ${r} (as trainyard custom-jobs exec ${id} --replica ${r})` }, r)) : null],
        ["Output", spec.baseOutputDirectory ? h("code", {}, spec.baseOutputDirectory.outputUriPrefix) : null],
        ["Scheduling", Object.keys(sched).length ? h("code", {}, JSON.stringify(sched)) : null],
      ]),
      errorBlock(job.error),
      poolsTable(spec));
    cancel.sync(isTerminal(job.state) || shortState(job.state) === "CANCELLING");
  }
  /** Replicas hung now (the rule at currentHang), under the heading and as its badge. */
  function showHangs() {
    const hung = shortState(job.state) === "RUNNING" ? model.hangs() : [];
    put(hangSlot, hangBadge(hung, "big"));
    const after = job.labels && job.labels[HANG_LABEL];
    put(hangBox, hung.length ? h("div", { class: "hang-block" },
      h("b", {}, hung.length === 1 ? "A replica may be hung" : `${hung.length} replicas may be hung`),
      after ? h("span", { class: "small" }, ` (reported after ${after} s of silence, label ${HANG_LABEL})`) : null,
      hung.map(({ replica, hang }) => h("div", { class: "hang-item", "data-replica": replica },
        h("b", {}, replica), ` reported hung at ${dateTime(hang.us / 1000)} (${duration(Date.now() - hang.us / 1000)} ago); nothing from it since. `,
        h("span", { class: "hang-text" }, hang.text)))) : null);
  }
  async function refresh() {
    job = await api(path, { signal: pg.signal });
    showJob();
    timeline.draw();
  }
  showJob();
  performance.mark("trainyard:job-shown");

  // The timeline, fed by the whole log (all replicas); drawn again at most every 0.5 s.
  const model = new TimelineModel();
  const timeline = {
    pending: false,
    draw() {
      drawTimeline(timelineBox, legend, model, job);
      transitionsCount.textContent = `(${model.events.length})`;
      showTransitions(transitions, model, job);
      showHangs();
    },
    soon() {
      if (this.pending) return;
      this.pending = true;
      setTimeout(() => { this.pending = false; if (!pg.signal.aborted) this.draw(); }, 500);
    },
  };
  timeline.draw();
  const onResize = () => timeline.soon();
  window.addEventListener("resize", onResize);
  pg.cleanups.push(() => window.removeEventListener("resize", onResize));

  // Logs: one followed stream of the whole log's newest tailN entries (tail=N: the server
  // reads the log, the page gets its end, then what comes) feeds the timeline and, unless
  // a replica is chosen, the log pane; a chosen replica has its own stream (?replica=).
  const tailQ = tailN ? `&tail=${tailN}` : "";
  const pane = new LogPane(logEl, {
    step: tailN,
    earlier: (n) => loadEarlier(n),
    // An ended log's count includes the lines loaded since.
    loaded: () => { if (status.classList.contains("ended")) setStatus(`ended · ${pane.count} lines`, "ended"); },
  });
  const seen = new Set(replicasOf(job.jobSpec));
  const addReplicaOptions = () => {
    const have = new Set([...replicaSelect.options].map((o) => o.value));
    for (const r of [...seen].sort(replicaOrder)) if (!have.has(r)) replicaSelect.append(h("option", { value: r }, r));
  };
  seen.add("service");
  addReplicaOptions();
  const { q } = parseHash();
  let replica = q.get("replica") || "";
  if (replica) { seen.add(replica); addReplicaOptions(); replicaSelect.value = replica; }
  let paneStream = null;
  // A stream that broke (the network, a server restart) is read again by reloading the
  // page: the logs API has no offset to resume from.
  const setStatus = (text, cls) => {
    put(status, text, cls === "broken" ? [" ", h("button", { type: "button", onclick: () => route() }, "Reconnect")] : null);
    status.className = "stream-status " + (cls || "");
  };

  function startPaneStream() {
    if (paneStream) paneStream.abort();
    pane.clear();
    if (!replica) {
      paneStream = null;
      pane.push(mainEntries);
      if (mainDone) { pane.done(); setStatus(`ended · ${pane.count} lines`, "ended"); } else setStatus("streaming…", "live");
      return;
    }
    const ac = new AbortController();
    paneStream = ac;
    pg.cleanups.push(() => ac.abort());
    setStatus("streaming…", "live");
    streamNdjson(`${path}/logs?follow=true&replica=${enc(replica)}${tailQ}`, ac.signal, (entries) => pane.push(entries))
      .then(() => { if (paneStream === ac) { pane.done(); setStatus(`ended · ${pane.count} lines`, "ended"); } })
      .catch((e) => { if (e.name !== "AbortError") { setStatus("interrupted", "broken"); report(e, "log"); } });
  }
  replicaSelect.addEventListener("change", () => {
    replica = replicaSelect.value;
    const nq = new URLSearchParams();
    if (replica) nq.set("replica", replica);
    history.replaceState(null, "", location.pathname + location.search + hashWith(["jobs", id], nq));
    startPaneStream();
  });

  // "Load earlier": the logs API reads a log's end (tail) or from a time on (since), not
  // up to a point. So the pane asks for the newest (shown + n + slack) entries of what it
  // shows (all replicas, or the chosen one) and takes the n before its oldest line, found
  // in the answer by its first lines (time to the microsecond, replica, run, stream,
  // text). The slack covers lines written meanwhile; when more came, it asks again.
  async function loadEarlier(n) {
    const sel = replica ? "&replica=" + enc(replica) : "";
    const have = pane.count + pane.queue.length;
    let slack = 200;
    for (let tries = 0; tries < 4; tries++) {
      const want = Math.min(MAX_TAIL, have + n + slack);
      const got = await readNdjson(`${path}/logs?tail=${want}${sel}`, pg.signal);
      const at = findRun(got, pane.head, got.length - have);
      if (at < 0) {
        if (want === MAX_TAIL) break;
        slack *= 8;
        continue;
      }
      const from = Math.max(0, at - n);
      // All of the log came (fewer entries than asked): nothing is before the first.
      const whole = got.length < want;
      return { entries: got.slice(from, at), start: from === 0 && whole, capped: from === 0 && !whole && want === MAX_TAIL };
    }
    throw new Error("The earlier lines could not be matched with the lines shown (the log grows fast, or is past the logs API's last 100,000 entries); reload the page.");
  }

  // The entries of the followed stream are kept (for the pane when the replica filter is
  // cleared); their number is capped like the pane's.
  let mainEntries = [];
  let mainDone = false;
  let mainCount = 0, mainOldest = Infinity;
  function onMain(entries) {
    for (const e of entries) {
      model.add(e);
      const us = micros(e.time);
      if (us < mainOldest) mainOldest = us;
      if (!seen.has(e.replica)) { seen.add(e.replica); addReplicaOptions(); }
    }
    for (const e of entries) mainEntries.push(e);
    if (mainEntries.length > LOG_KEEP * 1.25) mainEntries.splice(0, mainEntries.length - LOG_KEEP);
    mainCount += entries.length;
    if (!replica) pane.push(entries);
    timeline.soon();
    readHistory();
  }
  // The timeline needs the whole log (a run's bar starts at its first line, and lifecycle
  // events may be older than the tail), the pane only its end. Once the followed stream
  // has brought tailN entries (the log may be longer than its tail), the log is read once
  // more, whole and not followed, for the timeline only, after the pane's first lines:
  // of it the model takes the lines older than the stream's oldest entry (of the lines of
  // that very microsecond, those the stream did not bring), and the events it has not
  // seen (it takes each event once). Nothing of it goes to the pane.
  let historyAsked = false;
  function readHistory() {
    if (historyAsked || !tailN || mainCount < tailN) return;
    historyAsked = true;
    const cut = mainOldest;
    const atCut = new Map();
    for (const e of mainEntries) {
      if (e.stream !== "event" && micros(e.time) === cut) atCut.set(entryKey(e), (atCut.get(entryKey(e)) || 0) + 1);
    }
    const older = (e) => {
      const us = micros(e.time);
      if (us !== cut) return us < cut;
      const k = entryKey(e), n = atCut.get(k) || 0;
      if (n) atCut.set(k, n - 1);
      return !n;
    };
    streamNdjson(`${path}/logs`, mainAc.signal, (entries) => {
      for (const e of entries) if (e.stream === "event" || older(e)) model.add(e);
      timeline.soon();
    }).then(() => performance.mark("trainyard:history-complete"))
      .catch((e) => report(e, "log-history"));
  }
  const mainAc = new AbortController();
  pg.cleanups.push(() => mainAc.abort());
  setStatus(isTerminal(job.state) ? "loading…" : "streaming…", "live");
  streamNdjson(`${path}/logs?follow=true${tailQ}`, mainAc.signal, onMain).then(() => {
    mainDone = true;
    if (!replica) { pane.done(); setStatus(`ended · ${pane.count} lines`, "ended"); }
    // The log ends when the job is terminal: show its final fields.
    return refresh();
  }).catch((e) => {
    if (e.name === "AbortError") return;
    setStatus("interrupted", "broken");
    report(e, "log");
  });
  if (replica) startPaneStream();

  every(pg, 2000, async () => {
    if (isTerminal(job.state) && mainDone) return;
    await refresh();
  });
  every(pg, 1000, () => { if (!isTerminal(job.state)) timeline.soon(); });
}

// ---------------------------------------------------------------------------------------
// The log pane: lines are appended in batches (one per animation frame), never reloaded.
// It follows the newest line until the reader scrolls up (then their position is kept),
// and follows again once they are back at the bottom. It opens on the newest lines of
// the log (the stream's tail); "Load earlier" at its top puts the lines before them above,
// the line the reader sees staying where it is.
// Lines live in chunks of LOG_CHUNK with `content-visibility: auto`, so that the browser
// lays out and paints only the chunks in view: a 10,000-line log costs about as much to
// show as a screenful. Past LOG_KEEP lines the oldest chunks leave the page.

const LOG_KEEP = 50000;
const LOG_CHUNK = 500;
const LINE_PX = 17.4; // 12px text, line-height 1.45: the size of a chunk not yet laid out
const HEAD_KEEP = 8; // the oldest lines shown, kept to find them in a later answer
class LogPane {
  /**
   * `step`: lines the pane opens on and loads at a time (0: all); `earlier(n)`: the n
   * entries before the oldest shown ({entries, start, capped}); `loaded()`: after a load.
   */
  constructor(el, opts) {
    this.el = el;
    this.step = (opts && opts.step) || 0;
    this.earlier = opts && opts.earlier;
    this.loaded = (opts && opts.loaded) || (() => {});
    this.gen = 0;
    // A chunk's height is an estimate until it is drawn (content-visibility): when the
    // drawn height differs, a pane that follows stays at the bottom even if no line
    // comes after (a stream that pauses).
    this.sizes = typeof ResizeObserver === "function" ? new ResizeObserver(() => {
      if (this.follow) { this.el.scrollTop = this.el.scrollHeight; this.autoTop = this.el.scrollTop; }
    }) : null;
    this.clear();
    el.addEventListener("scroll", () => this.syncFollow(), { passive: true });
  }
  /**
   * Whether the pane follows the newest line, from where it is now: at the bottom, it
   * follows; moved up since the pane last scrolled itself, the reader reads. Asked again
   * before lines are added: a scroll event may not have come yet.
   */
  syncFollow() {
    const el = this.el;
    if (el.scrollHeight - el.scrollTop - el.clientHeight < 24) this.follow = true;
    else if (el.scrollTop < this.autoTop - 4) this.follow = false;
  }
  clear() {
    this.gen++;
    if (this.sizes) this.sizes.disconnect();
    this.queue = [];
    this.count = 0;
    this.dropped = 0;
    this.scheduled = false;
    this.chunks = [];
    this.follow = true;
    this.autoTop = 0;
    this.head = [];
    this.loading = false;
    this.atStart = false;
    this.capped = false;
    this.loadError = "";
    this.topKey = "";
    // The bar above the lines: "Load earlier", or why there is none.
    this.top = h("div", { class: "log-top", id: "log-top", hidden: true });
    put(this.el, this.top);
  }
  push(entries) {
    for (const e of entries) this.queue.push(e);
    if (!this.scheduled) {
      this.scheduled = true;
      const run = () => { if (this.scheduled) { this.scheduled = false; this.flush(); } };
      requestAnimationFrame(run);
      setTimeout(run, 100);
    }
  }
  line(e) {
    const d = document.createElement("div");
    d.className = e.stream === "event" ? "l ev" : e.stream === "stderr" ? "l err" : "l out";
    const t = Date.parse(e.time);
    const ts = document.createElement("span");
    ts.className = "t";
    ts.textContent = Number.isFinite(t) ? clock(t, true) : String(e.time || "");
    const who = document.createElement("span");
    who.className = "r";
    who.textContent = (e.attempt ? `a${e.attempt} ` : "") + e.replica + (e.restart ? `#${e.restart}` : "");
    d.append(ts, who, String(e.text ?? ""));
    return d;
  }
  /** A chunk of lines for `entries` (at most LOG_CHUNK), not yet in the page. */
  chunk(entries) {
    const c = { el: document.createElement("div"), n: 0 };
    c.el.className = "chunk";
    this.fillChunk(c, entries);
    return c;
  }
  fillChunk(c, entries) {
    const frag = document.createDocumentFragment();
    for (const e of entries) frag.append(this.line(e));
    c.el.append(frag);
    c.n += entries.length;
    c.el.style.containIntrinsicSize = `auto ${Math.round(c.n * LINE_PX)}px`;
  }
  flush() {
    if (!this.queue.length) return;
    this.syncFollow();
    const el = this.el;
    let batch = this.queue;
    this.queue = [];
    if (batch.length > LOG_KEEP) { this.dropped += batch.length - LOG_KEEP; batch = batch.slice(batch.length - LOG_KEEP); }
    for (let i = 0; i < batch.length && this.head.length < HEAD_KEEP; i++) this.head.push(batch[i]);
    for (let i = 0; i < batch.length;) {
      let c = this.chunks[this.chunks.length - 1];
      if (!c || c.n >= LOG_CHUNK) {
        c = this.chunk([]);
        this.chunks.push(c);
        el.append(c.el);
        if (this.sizes) this.sizes.observe(c.el);
      }
      const take = Math.min(LOG_CHUNK - c.n, batch.length - i);
      this.fillChunk(c, batch.slice(i, i + take));
      i += take;
    }
    if (!this.count) performance.mark("trainyard:log-first");
    this.count += batch.length;
    // Past LOG_KEEP lines the oldest chunks leave (the reader's position is kept).
    let kept = this.count - this.dropped;
    if (this.chunks.length > 1 && kept - this.chunks[0].n >= LOG_KEEP) {
      const before = el.scrollHeight;
      while (this.chunks.length > 1 && kept - this.chunks[0].n >= LOG_KEEP) {
        const c = this.chunks.shift();
        if (this.sizes) this.sizes.unobserve(c.el);
        c.el.remove();
        this.dropped += c.n;
        kept -= c.n;
      }
      if (!this.follow) el.scrollTop -= before - el.scrollHeight;
    }
    this.syncTop();
    if (this.follow) {
      el.scrollTop = el.scrollHeight;
      this.autoTop = el.scrollTop;
    }
  }
  /**
   * The bar at the top, made again only when what it says changes (a live log flushes
   * every frame, and a button made again under the pointer would lose its click).
   */
  syncTop() {
    const kept = this.count - this.dropped;
    const room = LOG_KEEP - kept;
    const more = this.step && this.earlier && this.count >= this.step;
    let key, kids;
    if (this.dropped) {
      key = "dropped" + this.dropped;
      kids = `${fmtCount(this.dropped)} earlier lines are not shown (the newest ${fmtCount(kept)} are kept here; the logs API has them all).`;
    } else if (this.atStart) {
      key = "start";
      kids = "Start of the log.";
    } else if (this.capped) {
      key = "capped";
      kids = `The logs API gives the last ${fmtCount(MAX_TAIL)} entries; trainyard custom-jobs stream-logs reads the whole log.`;
    } else if (more && room <= 0) {
      key = "full";
      kids = `The page keeps at most ${fmtCount(LOG_KEEP)} lines; trainyard custom-jobs stream-logs reads the whole log.`;
    } else if (more) {
      const n = Math.min(this.step, room);
      key = `more ${n} ${this.loading} ${this.loadError}`;
      kids = [h("button", { type: "button", id: "log-earlier", disabled: this.loading, onclick: () => this.loadEarlier() }, this.loading ? "Loading…" : `Load ${fmtCount(n)} earlier lines`),
        " ", h("span", { class: this.loadError ? "errtext" : "muted" }, this.loadError || "Earlier lines are not loaded.")];
    } else {
      key = "";
      kids = null;
    }
    if (key === this.topKey) return;
    this.topKey = key;
    put(this.top, kids);
    this.top.hidden = !kids;
  }
  async loadEarlier() {
    if (this.loading || !this.earlier) return;
    const gen = this.gen;
    this.loading = true;
    this.loadError = "";
    this.syncTop();
    try {
      const r = await this.earlier(Math.min(this.step, LOG_KEEP - this.count));
      if (gen !== this.gen) return;
      this.prepend(r.entries);
      this.atStart = r.start;
      this.capped = r.capped;
      this.loaded();
    } catch (e) {
      if (gen !== this.gen || e.name === "AbortError") return;
      this.loadError = e.message || String(e);
      report(e, "log-earlier");
    } finally {
      if (gen === this.gen) { this.loading = false; this.syncTop(); }
    }
  }
  /** The first line in view and its distance from the pane's top. */
  lineInView() {
    const top = this.el.getBoundingClientRect().top;
    for (const c of this.chunks) {
      if (c.el.getBoundingClientRect().bottom <= top) continue;
      for (const l of c.el.children) {
        const r = l.getBoundingClientRect();
        if (r.bottom > top) return { l, y: r.top - top };
      }
    }
    return null;
  }
  /** Earlier lines above the oldest shown; the line in view stays where it is. */
  prepend(entries) {
    if (!entries.length) return;
    this.syncFollow();
    const el = this.el;
    const anchor = this.follow ? null : this.lineInView();
    const first = this.chunks.length ? this.chunks[0].el : null;
    const made = [];
    for (let i = 0; i < entries.length; i += LOG_CHUNK) made.push(this.chunk(entries.slice(i, i + LOG_CHUNK)));
    for (const c of made) el.insertBefore(c.el, first);
    this.chunks.unshift(...made);
    this.head = entries.slice(0, HEAD_KEEP).concat(this.head).slice(0, HEAD_KEEP);
    this.count += entries.length;
    // Measured after the change, so that it holds whether or not the browser's own scroll
    // anchoring already moved the pane.
    if (anchor) el.scrollTop += anchor.l.getBoundingClientRect().top - el.getBoundingClientRect().top - anchor.y;
    else if (this.follow) { el.scrollTop = el.scrollHeight; this.autoTop = el.scrollTop; }
  }
  done() {
    this.flush();
    if (!this.count) put(this.el, h("div", { class: "l note" }, "No log lines."));
    performance.mark("trainyard:log-complete");
  }
}

// ---------------------------------------------------------------------------------------
// The timeline: attempts, replicas, restarts and waiting, from the job's log events.

/** What a job-level event starts: a phase of the "job" row, or null (no change). */
function phaseOf(text) {
  if (/^(L\w+: )?Job queued|Waiting for capacity|FLEX_START: waiting|stockout|no capacity/i.test(text)) return "queued";
  if (/admitted|provisioned/i.test(text)) return "provisioning";
  if (/Job is running/i.test(text)) return "running";
  if (/Job retry/i.test(text)) return "retrying";
  if (/Cancel requested/i.test(text)) return "cancelling";
  if (/Job (completed|failed|cancelled)|preempted/i.test(text)) return "end";
  return null;
}

class TimelineModel {
  constructor() {
    // replica -> {segs: Map "a/r" -> seg, events: [], hang: its newest TY4/TY5 report,
    // lastUs: its newest other entry (µs)}
    this.rows = new Map();
    this.service = [];
    this.events = [];
    this.eventKeys = new Set(); // each event once (the log may be read twice, see readHistory)
    this.lastAttempt = 0;
    this.attempts = new Map(); // attempt -> first time
    this.running = new Map(); // attempt -> time of "Job is running"
    this.minT = Infinity;
    this.maxT = -Infinity;
  }
  row(name) {
    let r = this.rows.get(name);
    if (!r) { r = { segs: new Map(), events: [], hang: null, lastUs: -Infinity }; this.rows.set(name, r); }
    return r;
  }
  seg(row, attempt, restart) {
    const key = `${attempt}/${restart}`;
    let sg = row.segs.get(key);
    if (!sg) { sg = { attempt, restart, start: Infinity, last: -Infinity, lines: 0 }; row.segs.set(key, sg); }
    return sg;
  }
  add(e) {
    const t = Date.parse(e.time);
    if (!Number.isFinite(t)) return;
    if (e.stream === "event") {
      const key = entryKey(e);
      if (this.eventKeys.has(key)) return;
      this.eventKeys.add(key);
    }
    const a = Number(e.attempt) || 0;
    if (a > this.lastAttempt) this.lastAttempt = a;
    // Hangs, by the rule at currentHang.
    if (e.replica && e.replica !== "service") {
      const row = this.row(e.replica);
      const us = micros(e.time);
      if (isHangReport(e)) {
        if (!row.hang || us > row.hang.us) row.hang = { us, time: e.time, text: String(e.text || ""), attempt: a };
      } else if (!isHangDump(e) && us > row.lastUs) row.lastUs = us;
    }
    if (t < this.minT) this.minT = t;
    if (t > this.maxT) this.maxT = t;
    if (!this.attempts.has(a) || t < this.attempts.get(a)) this.attempts.set(a, t);
    if (e.stream === "event") {
      const ev = { t, attempt: a, replica: e.replica, rule: e.rule || (/^(L\d+[a-z]?|TY\d+):/.exec(e.text || "") || [])[1] || "", text: String(e.text || ""), time: e.time, hang: isHangReport(e) };
      this.events.push(ev);
      if (e.replica === "service" || !e.replica) {
        this.service.push(ev);
        if (/Job is running/.test(ev.text) && !this.running.has(a)) this.running.set(a, t);
      } else {
        const row = this.row(e.replica);
        row.events.push(ev);
        const m = /restarting it \((\d+) of/.exec(ev.text);
        if (m) { const sg = this.seg(row, a, Number(m[1])); sg.start = Math.min(sg.start, t); }
        const first = this.seg(row, a, 0);
        if (!Number.isFinite(first.start) || !first.lines) first.start = Math.min(first.start, t);
      }
    } else {
      const sg = this.seg(this.row(e.replica), a, Number(e.restart) || 0);
      if (t < sg.start) sg.start = t;
      if (t > sg.last) sg.last = t;
      sg.lines++;
    }
  }
  /** Replicas hung now: [{replica, hang}] (whether the job still runs is the caller's). */
  hangs() {
    const out = [];
    for (const [replica, r] of this.rows) {
      if (r.hang && r.hang.us > r.lastUs && r.hang.attempt >= this.lastAttempt) out.push({ replica, hang: r.hang });
    }
    return out.sort((a, b) => replicaOrder(a.replica, b.replica));
  }
}

/** Tick spacing for a span of `ms` in about `n` steps. */
function tickStep(ms, n) {
  const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5, 36e5, 72e5, 108e5, 216e5, 432e5, 864e5, 1728e5, 6048e5];
  return steps.find((x) => ms / x <= n) || steps[steps.length - 1];
}
function tickLabel(t, step) {
  if (step >= 864e5) return dateTime(t).slice(5, 10);
  if (step < 1000) return clock(t, true).slice(3);
  return clock(t);
}

function drawTimeline(box, legend, model, job) {
  const now = Date.now();
  const created = parseTime(job.createTime);
  const ended = parseTime(job.endTime);
  const terminal = isTerminal(job.state);
  let t0 = Math.min(Number.isFinite(created) ? created : Infinity, model.minT);
  if (!Number.isFinite(t0)) t0 = now;
  let t1 = Number.isFinite(ended) ? Math.max(ended, model.maxT) : terminal ? model.maxT : Math.max(now, model.maxT);
  if (!(t1 > t0)) t1 = t0 + 1000;
  const endOfJob = t1;

  const names = [...model.rows.keys()].sort(replicaOrder);
  const W = Math.max(520, Math.floor(box.clientWidth || 960));
  const L = 150, R = 56, TOP = 30, ROW = 26;
  const H = TOP + (names.length + 1) * ROW + 8;
  const plot = W - L - R;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * plot;
  const svg = s("svg", { class: "timeline", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "Timeline of the job's attempts, replicas and restarts" });

  // Axis.
  const step = tickStep(t1 - t0, Math.max(3, Math.floor(plot / 110)));
  const axis = s("g", { class: "axis" });
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    const xx = x(t);
    axis.append(s("line", { x1: xx, x2: xx, y1: TOP - 6, y2: H - 6, class: "grid" }), s("text", { x: xx, y: TOP - 10, "text-anchor": "middle" }, tickLabel(t, step)));
  }
  svg.append(axis);

  // Rows: the job (service events and phases), then one per replica.
  const rowY = (i) => TOP + i * ROW;
  const rowsG = s("g", { class: "rows" });
  ["job", ...names].forEach((n, i) => {
    rowsG.append(s("rect", { x: 0, y: rowY(i), width: W, height: ROW, class: i % 2 ? "band odd" : "band" }),
      s("text", { x: 8, y: rowY(i) + ROW / 2 + 4, class: "label" }, n === "job" ? "job" : n));
  });
  svg.append(rowsG);

  // Attempt boundaries.
  const attempts = [...model.attempts.entries()].sort((a, b) => a[0] - b[0]);
  const attemptEnd = (a) => {
    const nxt = attempts.find(([b]) => b > a);
    return nxt ? nxt[1] : endOfJob;
  };
  for (const [a, t] of attempts) {
    if (a === 0) continue;
    const xx = x(t);
    svg.append(s("line", { x1: xx, x2: xx, y1: TOP - 4, y2: H - 6, class: "attempt-line" }),
      s("text", { x: xx + 3, y: TOP + 10, class: "attempt-label" }, `attempt ${a}`));
  }

  // The job row: phases between job-level events.
  const jobG = s("g", { class: "phases" });
  const svcEvents = [...model.service].sort((a, b) => a.t - b.t);
  let phase = null, since = t0;
  const closePhase = (until) => {
    if (phase && phase !== "end" && until > since) {
      jobG.append(s("rect", { x: x(since), y: rowY(0) + 6, width: Math.max(1.5, x(until) - x(since)), height: ROW - 12, rx: 2, class: `ph ph-${phase}` },
        title(`${phase} · ${clock(since, true)} → ${clock(until, true)} (${duration(until - since)})`)));
    }
  };
  for (const ev of svcEvents) {
    const p = phaseOf(ev.text);
    if (p && p !== phase) { closePhase(ev.t); phase = p; since = ev.t; }
  }
  closePhase(endOfJob);
  svg.append(jobG);

  // Replica rows: one bar per run (attempt, restart), coloured by how it ended.
  const segsG = s("g", { class: "segs" });
  const state = shortState(job.state);
  const lastAttempt = attempts.length ? attempts[attempts.length - 1][0] : 0;
  names.forEach((n, idx) => {
    const row = model.rows.get(n);
    const i = idx + 1;
    const byAttempt = new Map();
    for (const sg of row.segs.values()) {
      if (!byAttempt.has(sg.attempt)) byAttempt.set(sg.attempt, []);
      byAttempt.get(sg.attempt).push(sg);
    }
    for (const [a, list] of byAttempt) {
      list.sort((p, q) => p.restart - q.restart);
      const aEnd = attemptEnd(a);
      list.forEach((sg, k) => {
        let start = sg.start;
        if (sg.restart === 0 && model.running.has(a)) start = Math.min(start, model.running.get(a));
        if (!Number.isFinite(start)) return;
        const nextSeg = list[k + 1];
        let end, cls, why = null;
        const stop = row.events.find((ev) => ev.attempt === a && ev.t >= start - 1 && /^(L20|L17|L16)$/.test(ev.rule));
        if (nextSeg && Number.isFinite(nextSeg.start)) {
          end = nextSeg.start;
          cls = "restarted";
          why = row.events.find((ev) => ev.attempt === a && Math.abs(ev.t - end) < 5 && /restart/i.test(ev.text));
        } else if (stop) {
          end = stop.t;
          why = stop;
          cls = /status 0/.test(stop.text) ? "ok" : a < lastAttempt ? "retried" : state === "SUCCEEDED" ? "ok" : state === "CANCELLED" || state === "CANCELLING" ? "cancelled" : /signal 15|SIGTERM/.test(stop.text) ? "stopped" : "failed";
        } else {
          end = Math.max(aEnd, sg.last);
          cls = a < lastAttempt ? "retried" : terminal ? (state === "SUCCEEDED" ? "ok" : state === "CANCELLED" ? "cancelled" : "failed") : "live";
        }
        end = Math.max(end, start);
        const tip = `${n} · attempt ${a} · restart ${sg.restart}\n${clock(start, true)} → ${cls === "live" ? "now" : clock(end, true)} (${duration(end - start)}), ${sg.lines} log lines` +
          (why ? `\nended: ${why.text}` : cls === "live" ? "\nrunning" : "");
        segsG.append(s("rect", { x: x(start), y: rowY(i) + 5, width: Math.max(2, x(end) - x(start) - (nextSeg ? 2 : 0)), height: ROW - 10, rx: 3, class: `seg seg-${cls}`, "data-replica": n, "data-attempt": a, "data-restart": sg.restart }, title(tip)));
      });
    }
  });
  svg.append(segsG);

  // Hangs: a band from the TY4/TY5 report to now on a replica hung now (the rule at
  // currentHang); every report also gets its own marker below.
  if (state === "RUNNING") {
    const hangsG = s("g", { class: "hangs" });
    for (const { replica, hang } of model.hangs()) {
      const i = names.indexOf(replica) + 1;
      if (i <= 0) continue;
      const x0 = x(hang.us / 1000);
      hangsG.append(s("rect", { x: x0, y: rowY(i) + 3, width: Math.max(3, x(now) - x0), height: ROW - 6, class: "hang-span", "data-replica": replica },
        title(`${replica} · hung since ${clock(hang.us / 1000, true)} (${duration(now - hang.us / 1000)}), nothing from it since\n${hang.text}`)));
    }
    svg.append(hangsG);
  }

  // Markers: every lifecycle event with its rule; events closer than a few pixels in a
  // row share one marker (its label lists their rules, its tooltip their reasons).
  const marks = s("g", { class: "marks" });
  const rowOf = (ev) => (ev.replica === "service" || !ev.replica ? 0 : names.indexOf(ev.replica) + 1);
  const clusters = [];
  const open = new Map();
  for (const ev of [...model.events].sort((a, b) => a.t - b.t)) {
    const i = rowOf(ev);
    if (i < 0) continue;
    const c = open.get(i);
    if (c && x(ev.t) - x(c.evs[c.evs.length - 1].t) < 7) c.evs.push(ev);
    else { const n = { row: i, evs: [ev] }; clusters.push(n); open.set(i, n); }
  }
  const lastLabel = new Map();
  for (const c of clusters) {
    const xx = x(c.evs[0].t), cy = rowY(c.row) + ROW / 2;
    const texts = c.evs.map((ev) => ev.text).join(" ");
    const kind = /fail|error|OOM|out of memory|could not|killed by signal (?!15\b)/i.test(texts) ? "bad" : /retry|restart/i.test(texts) ? "warn" : "info";
    const rules = [...new Set(c.evs.map((ev) => ev.rule).filter(Boolean))];
    const hang = c.evs.find((ev) => ev.hang);
    const g = s("g", { class: `mk mk-${hang ? "hang" : kind}`, "data-rule": rules.join(" "), "data-hang": hang ? hang.time : null },
      s("path", { d: `M${xx} ${cy - 5}L${xx + 4} ${cy}L${xx} ${cy + 5}L${xx - 4} ${cy}Z` }),
      title(c.evs.map((ev) => `${clock(ev.t, true)} · attempt ${ev.attempt} · ${ev.replica}\n${ev.text}`).join("\n\n")));
    const label = rules.join("·");
    if (label && (lastLabel.get(c.row) === undefined || xx - lastLabel.get(c.row) > 8)) {
      // Right of the marker, or left of it where the label would pass the right edge.
      const fits = xx + 5 + label.length * 6 < W - 4;
      g.append(s("text", { x: fits ? xx + 5 : xx - 5, y: rowY(c.row) + 9, class: "rule", "text-anchor": fits ? "start" : "end" }, label));
      lastLabel.set(c.row, fits ? xx + 5 + label.length * 6 : xx);
    }
    // A hang report says when, in the row itself (its text is the marker's tooltip).
    if (hang) {
      const right = xx + 80 < W - 4;
      g.append(s("text", { x: right ? xx + 7 : xx - 7, y: rowY(c.row) + ROW - 4, "text-anchor": right ? "start" : "end", class: "hang-label" }, `hung ${clock(hang.t)}`));
    }
    marks.append(g);
  }
  svg.append(marks);
  if (!terminal) svg.append(s("line", { x1: x(now), x2: x(now), y1: TOP - 4, y2: H - 6, class: "now" }, title("now")));
  if (!model.events.length && !names.length) svg.append(s("text", { x: L, y: TOP + ROW / 2 + 4, class: "muted-text" }, "No events yet."));
  put(box, svg);

  if (!legend.childElementCount) {
    const key = (cls, text) => h("span", { class: "key" }, s("svg", { width: 14, height: 10 }, s("rect", { x: 0, y: 0, width: 14, height: 10, rx: 2, class: cls })), " ", text);
    legend.append(key("ph ph-queued", "queued / waiting"), key("ph ph-provisioning", "provisioning"), key("ph ph-running", "job running"),
      key("seg seg-live", "replica running"), key("seg seg-ok", "succeeded"), key("seg seg-restarted", "restarted"), key("seg seg-retried", "attempt retried"),
      key("seg seg-failed", "failed"), key("seg seg-cancelled", "cancelled / stopped"), h("span", { title: "rules TY4 (hangs), TY5 (stragglers)" }, key("hang-span", "hung: no output or progress since")),
      h("span", { class: "muted small" }, " ◆ lifecycle event with its rule (hover for the reason); times are local"));
  }
}

function showTransitions(tbody, model, job) {
  const created = parseTime(job.createTime);
  const evs = [...model.events].sort((a, b) => a.t - b.t);
  if (tbody.childElementCount === evs.length && evs.length) return;
  put(tbody, ...evs.map((ev) => h("tr", {},
    h("td", { class: "time", title: ev.time }, clock(ev.t, true)),
    h("td", { class: "num" }, Number.isFinite(created) ? "+" + duration(ev.t - created) : ""),
    h("td", { class: "num" }, ev.attempt),
    h("td", {}, ev.replica),
    h("td", {}, ev.rule ? h("span", { class: "rule-badge" }, ev.rule) : ""),
    h("td", { class: "what" }, ev.rule && ev.text.startsWith(ev.rule + ": ") ? ev.text.slice(ev.rule.length + 2) : ev.text))));
}

// ---------------------------------------------------------------------------------------
// HyperparameterTuningJobs: list and study page (trials, objective plot, measurements).

function tuningList(pg, q) {
  document.title = "Tuning · Trainyard";
  const filter = (q.get("filter") || "").trim();
  const table = pagedTable(pg, {
    path: () => base() + "/hyperparameterTuningJobs?pageSize=100" + (filter ? "&filter=" + enc(filter) : ""),
    collection: "hyperparameterTuningJobs",
    href: (j) => hashWith(["tuning", lastSegment(j.name)]),
    empty: filter ? "No tuning job matches this filter." : `No hyperparameter tuning jobs in project ${project()} (${region()}).`,
    columns: [
      { h: "Name", cls: "id", cell: (j) => h("a", { href: hashWith(["tuning", lastSegment(j.name)]), title: j.name }, lastSegment(j.name)) },
      { h: "Display name", cell: (j) => j.displayName || "" },
      { h: "State", cell: (j) => chip(j.state) },
      { h: "Algorithm", cell: (j) => (j.studySpec && j.studySpec.algorithm) || "default (Bayesian)" },
      { h: "Objective", cell: (j) => { const m = j.studySpec && j.studySpec.metrics && j.studySpec.metrics[0]; return m ? `${(m.goal || "").toLowerCase()} ${m.metricId}` : "—"; } },
      { h: "Trials", cls: "num", cell: (j) => `${j.maxTrialCount ?? "?"} (${j.parallelTrialCount ?? 1} at a time)` },
      { h: "Created", cls: "time", cell: (j) => timeCell(j.createTime) },
      { h: "Elapsed", cls: "num", cell: (j) => elapsed(j) },
    ],
  });
  view.append(h("section", { class: "card" }, h("h2", {}, "Hyperparameter tuning jobs ", h("span", { class: "muted small" }, `${project()} · ${region()}`)),
    filterBox(q, "tuning", 'e.g. display_name:"sweep"'), table.el));
  every(pg, 3000, () => table.load().catch(saidInTable));
  return table.load(true).catch(saidInTable);
}

const metricValue = (measurement, id) => {
  const m = measurement && (measurement.metrics || []).find((x) => x.metricId === id);
  return m && typeof m.value === "number" ? m.value : undefined;
};
const paramValue = (trial, id) => {
  const p = (trial.parameters || []).find((x) => x.parameterId === id);
  return p ? p.value : undefined;
};

/** Nice round ticks for [lo, hi]. */
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
  const raw = (hi - lo) / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((k) => k * mag).find((k) => raw <= k) || 10 * mag;
  const ticks = [];
  const top = Math.ceil(hi / step - 1e-9) * step;
  for (let v = Math.floor(lo / step + 1e-9) * step; v <= top + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  return { lo: Math.min(lo, ticks[0]), hi: Math.max(hi, ticks[ticks.length - 1]), ticks };
}

function drawStudyPlot(box, study) {
  const metric = ((study.studySpec || {}).metrics || [])[0] || {};
  const goal = String(metric.goal || "MAXIMIZE").toUpperCase();
  const better = goal === "MINIMIZE" ? (a, b) => a < b : (a, b) => a > b;
  const trials = [...(study.trials || [])].sort((a, b) => Number(a.id) - Number(b.id));
  const pts = trials.map((t) => ({ n: Number(t.id), v: metricValue(t.finalMeasurement, metric.metricId), t })).filter((p) => Number.isFinite(p.n));
  const valued = pts.filter((p) => p.v !== undefined);
  const W = Math.max(480, Math.floor(box.clientWidth || 800)), H = 280;
  const L = 64, R = 18, T = 16, B = 40;
  const svg = s("svg", { class: "plot", id: "trials-plot-svg", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `Objective ${metric.metricId} by trial` });
  const maxN = Math.max(1, ...pts.map((p) => p.n), Number(study.maxTrialCount) || 0);
  const xs = (n) => L + ((n - 0.5) / maxN) * (W - L - R);
  const vals = valued.map((p) => p.v);
  const yt = niceTicks(vals.length ? Math.min(...vals) : 0, vals.length ? Math.max(...vals) : 1, 5);
  const ys = (v) => T + (1 - (v - yt.lo) / (yt.hi - yt.lo)) * (H - T - B);
  const axis = s("g", { class: "axis" });
  for (const v of yt.ticks) axis.append(s("line", { x1: L, x2: W - R, y1: ys(v), y2: ys(v), class: "grid" }), s("text", { x: L - 6, y: ys(v) + 4, "text-anchor": "end" }, num(v, 3)));
  const xstep = Math.max(1, Math.ceil(maxN / Math.max(2, Math.floor((W - L - R) / 40))));
  for (let n = 1; n <= maxN; n += xstep) axis.append(s("text", { x: xs(n), y: H - B + 16, "text-anchor": "middle" }, String(n)));
  axis.append(s("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "base" }), s("line", { x1: L, x2: L, y1: T, y2: H - B, class: "base" }),
    s("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-title" }, "trial"),
    s("text", { x: 14, y: (T + H - B) / 2, "text-anchor": "middle", class: "axis-title", transform: `rotate(-90 14 ${(T + H - B) / 2})` }, metric.metricId || "objective"));
  svg.append(axis);
  // Best so far: a step line through the running best, by the goal.
  let best, bestPt = null, d = "";
  for (const p of valued) {
    if (best === undefined || better(p.v, best)) { best = p.v; bestPt = p; }
    d += d ? `H${xs(p.n)}V${ys(best)}` : `M${xs(p.n)} ${ys(best)}`;
  }
  if (d) { d += `H${xs(maxN + 0.5)}`; svg.append(s("path", { d, class: "best" }, title(`best so far (${goal.toLowerCase()})`))); }
  for (const p of valued) {
    const params = (p.t.parameters || []).map((x) => `${x.parameterId}=${num(x.value)}`).join(", ");
    svg.append(s("circle", { cx: xs(p.n), cy: ys(p.v), r: p === bestPt ? 6 : 4, class: `pt pt-${p.t.state || "UNKNOWN"}${p === bestPt ? " pt-best" : ""}`, "data-trial": p.n },
      title(`trial ${p.n} · ${p.t.state}\n${metric.metricId} = ${p.v}\n${params}`)));
  }
  for (const p of pts.filter((x) => x.v === undefined)) {
    svg.append(s("circle", { cx: xs(p.n), cy: H - B - 6, r: 3, class: `pt pt-none pt-${p.t.state || "UNKNOWN"}` }, title(`trial ${p.n} · ${p.t.state}: no ${metric.metricId} yet`)));
  }
  if (!valued.length) svg.append(s("text", { x: (L + W) / 2, y: (T + H - B) / 2, "text-anchor": "middle", class: "muted-text" }, `No trial has reported ${metric.metricId || "its objective"} yet.`));
  put(box, svg);
  return bestPt && bestPt.t;
}

function sparkline(values) {
  const W = 160, H = 32;
  if (values.length < 2) return null;
  const lo = Math.min(...values), hi = Math.max(...values);
  const y = (v) => (hi > lo ? H - 3 - ((v - lo) / (hi - lo)) * (H - 6) : H / 2);
  const d = values.map((v, i) => `${i ? "L" : "M"}${(3 + (i / (values.length - 1)) * (W - 6)).toFixed(1)} ${y(v).toFixed(1)}`).join("");
  return s("svg", { class: "spark", width: W, height: H, viewBox: `0 0 ${W} ${H}` }, s("path", { d }), title(`${num(values[0])} → ${num(values[values.length - 1])}`));
}

async function studyPage(pg, id) {
  const name = `projects/${project()}/locations/${region()}/hyperparameterTuningJobs/${id}`;
  const path = `/v1/${name}`;
  document.title = `Tuning ${id} · Trainyard`;
  let study = await api(path, { signal: pg.signal });
  const expanded = new Set();
  const heading = h("h2", {});
  const summary = h("div", {});
  const plotBox = h("div", { class: "plot-box", id: "trials-plot" });
  const trialsBox = h("div", { id: "trials" });
  const cancel = cancelControl(pg, { path: name, what: "tuning job", isDone: isTerminal(study.state), after: () => refresh() });
  view.append(h("div", { class: "crumbs" }, h("a", { href: "#/tuning" }, "Tuning"), " / ", id),
    h("section", { class: "card" }, h("div", { class: "head" }, heading, cancel.el), summary),
    h("section", { class: "card" }, h("h3", {}, "Objective by trial"), plotBox, h("div", { class: "legend" },
      h("span", { class: "key" }, s("svg", { width: 12, height: 12 }, s("circle", { cx: 6, cy: 6, r: 4, class: "pt pt-SUCCEEDED" })), " trial's final measurement"),
      h("span", { class: "key" }, s("svg", { width: 18, height: 10 }, s("path", { d: "M0 5H18", class: "best" })), " best so far"),
      h("span", { class: "key" }, s("svg", { width: 14, height: 14 }, s("circle", { cx: 7, cy: 7, r: 6, class: "pt pt-SUCCEEDED pt-best" })), " best trial"))),
    h("section", { class: "card" }, h("h3", {}, "Trials"), trialsBox));

  function show() {
    const spec = study.studySpec || {};
    const metric = (spec.metrics || [])[0] || {};
    put(heading, study.displayName || `Tuning job ${id}`, " ", chip(study.state, "big"));
    const paramSpec = (p) => {
      if (p.doubleValueSpec) return `double [${p.doubleValueSpec.minValue ?? 0}, ${p.doubleValueSpec.maxValue ?? 0}]`;
      if (p.integerValueSpec) return `integer [${p.integerValueSpec.minValue ?? 0}, ${p.integerValueSpec.maxValue ?? 0}]`;
      if (p.categoricalValueSpec) return `categorical {${(p.categoricalValueSpec.values || []).join(", ")}}`;
      if (p.discreteValueSpec) return `discrete {${(p.discreteValueSpec.values || []).join(", ")}}`;
      return "?";
    };
    const trials = study.trials || [];
    const byState = {};
    for (const t of trials) byState[t.state] = (byState[t.state] || 0) + 1;
    put(summary, fields([
      ["Name", h("code", {}, study.name)],
      ["State", chip(study.state)],
      ["Objective", `${(metric.goal || "").toLowerCase()} ${metric.metricId || "?"}`],
      ["Algorithm", spec.algorithm || "default (Bayesian optimisation)"],
      ["Parameters", h("span", {}, (spec.parameters || []).map((p) => h("span", { class: "label" }, `${p.parameterId}: ${paramSpec(p)}${p.scaleType ? " " + p.scaleType.toLowerCase().replace(/_/g, " ") : ""}`)))],
      ["Trials", `${trials.length} of ${study.maxTrialCount ?? "?"} (${study.parallelTrialCount ?? 1} at a time${study.maxFailedTrialCount ? `, at most ${study.maxFailedTrialCount} failed` : ""})` +
        (trials.length ? ": " + Object.entries(byState).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(", ") : "")],
      ["Early stopping", spec.medianAutomatedStoppingSpec ? "median" : spec.decayCurveStoppingSpec ? "decay curve" : null],
      ["Created", timeCell(study.createTime)],
      ["Started", timeCell(study.startTime)],
      ["Ended", timeCell(study.endTime)],
      ["Elapsed", elapsed(study)],
    ]), errorBlock(study.error));
    const best = drawStudyPlot(plotBox, study);
    showTrials(best);
    cancel.sync(isTerminal(study.state));
  }
  function showTrials(best) {
    const spec = study.studySpec || {};
    const metricIds = [...new Set([...(spec.metrics || []).map((m) => m.metricId)])];
    const paramIds = (spec.parameters || []).map((p) => p.parameterId);
    const trials = [...(study.trials || [])].sort((a, b) => Number(a.id) - Number(b.id));
    const head = h("tr", {}, h("th", {}, ""), h("th", {}, "Trial"), h("th", {}, "State"), paramIds.map((p) => h("th", { class: "num" }, p)),
      metricIds.map((m) => h("th", { class: "num" }, m)), h("th", { class: "num" }, "Steps"), h("th", {}, "Elapsed"), h("th", {}, "Custom job"));
    const rows = [];
    for (const t of trials) {
      const open = expanded.has(t.id);
      const ms = t.measurements || [];
      const toggle = h("button", { type: "button", class: "expander", title: "Intermediate measurements", "aria-expanded": String(open), "data-trial": t.id }, open ? "▾" : "▸");
      toggle.addEventListener("click", () => { if (expanded.has(t.id)) expanded.delete(t.id); else expanded.add(t.id); showTrials(best); });
      rows.push(h("tr", { class: `trial${best && best.id === t.id ? " best" : ""}`, "data-trial": t.id },
        h("td", {}, ms.length ? toggle : ""),
        h("td", { class: "num" }, t.id, best && best.id === t.id ? h("span", { class: "best-tag", title: "best trial so far" }, " ★") : ""),
        h("td", {}, chip(t.state), t.trainyardStoppedEarly ? h("span", { class: "muted small stopped-early", title: "Stopped by the study's early-stopping rule: its CustomJob shows cancelled for it" }, " stopped early") : null),
        paramIds.map((p) => h("td", { class: "num" }, num(paramValue(t, p)))),
        metricIds.map((m) => h("td", { class: "num" }, num(metricValue(t.finalMeasurement, m)))),
        h("td", { class: "num" }, (t.finalMeasurement && t.finalMeasurement.stepCount) || (ms.length ? ms[ms.length - 1].stepCount : "—")),
        h("td", {}, elapsed(t)),
        h("td", {}, t.customJob ? resourceLink(t.customJob, lastSegment(t.customJob)) : "—")));
      if (open) {
        const allIds = [...new Set(ms.flatMap((m) => (m.metrics || []).map((x) => x.metricId)))];
        const timed = ms.some((m) => m.elapsedDuration);
        rows.push(h("tr", { class: "measurements", "data-trial": t.id }, h("td", {}), h("td", { colspan: 5 + paramIds.length + metricIds.length },
          h("div", { class: "measure" },
            h("table", { class: "list mini" }, h("thead", {}, h("tr", {}, h("th", { class: "num" }, "Step"), allIds.map((m) => h("th", { class: "num" }, m)), timed ? h("th", {}, "Elapsed") : null)),
              h("tbody", {}, ms.map((m) => h("tr", {}, h("td", { class: "num" }, m.stepCount ?? "—"), allIds.map((x) => h("td", { class: "num" }, num(metricValue(m, x)))),
                timed ? h("td", {}, m.elapsedDuration || "") : null)))),
            sparkline(ms.map((m) => metricValue(m, metricIds[0])).filter((v) => v !== undefined))),
          t.infeasibleReason ? h("p", { class: "errtext" }, t.infeasibleReason) : null)));
      }
    }
    if (!trials.length) rows.push(h("tr", {}, h("td", { colspan: 6 + paramIds.length + metricIds.length, class: "muted empty" }, "No trials yet.")));
    put(trialsBox, h("table", { class: "list trials" }, h("thead", {}, head), h("tbody", {}, rows)));
  }
  async function refresh() {
    study = await api(path, { signal: pg.signal });
    show();
  }
  show();
  every(pg, 3000, async () => { if (!isTerminal(study.state)) await refresh(); });
}

// ---------------------------------------------------------------------------------------
// Vizier studies (the SDK's `aiplatform.Study`, `google-vizier`): list and page, with
// their trials as the clients reported them and the optimal ones marked.

/** A study's objectives: `maximize accuracy, minimize latency`. */
const objectives = (spec) => ((spec && spec.metrics) || []).map((m) => `${String(m.goal || "").replace(/^GOAL_TYPE_UNSPECIFIED$/, "?").toLowerCase()} ${m.metricId}`).join(", ") || "—";

/** `grid search`; unspecified is the service's default (Bayesian optimisation). */
const algorithmName = (a) => (!a || a === "ALGORITHM_UNSPECIFIED" ? "default (Bayesian optimisation)" : String(a).toLowerCase().replace(/_/g, " "));

function vizierStudiesList(pg) {
  document.title = "Vizier studies · Trainyard";
  const table = pagedTable(pg, {
    path: () => base() + "/studies?pageSize=100",
    collection: "studies",
    href: (st) => hashWith(["studies", lastSegment(st.name)]),
    empty: `No Vizier studies in project ${project()} (${region()}).`,
    columns: [
      { h: "Name", cls: "id", cell: (st) => h("a", { href: hashWith(["studies", lastSegment(st.name)]), title: st.name }, lastSegment(st.name)) },
      { h: "Display name", cell: (st) => st.displayName || "" },
      { h: "State", cell: (st) => chip(st.state) },
      { h: "Objectives", cell: (st) => objectives(st.studySpec) },
      { h: "Algorithm", cell: (st) => algorithmName((st.studySpec || {}).algorithm) },
      { h: "Created", cls: "time", cell: (st) => timeCell(st.createTime) },
    ],
  });
  view.append(h("section", { class: "card" }, h("h2", {}, "Vizier studies ", h("span", { class: "muted small" }, `${project()} · ${region()}`)),
    h("p", { class: "muted small" }, "Studies a client asks for suggestions (Vizier). A tuning job's own trials are under Tuning."), table.el));
  every(pg, 3000, () => table.load().catch(saidInTable));
  return table.load(true).catch(saidInTable);
}

async function vizierStudyPage(pg, id) {
  const path = `/v1/projects/${enc(project())}/locations/${enc(region())}/studies/${enc(id)}`;
  document.title = `Study ${id} · Trainyard`;
  const heading = h("h2", {});
  const summary = h("div", {});
  const trialsBox = h("div", { id: "vizier-trials" });
  view.append(h("div", { class: "crumbs" }, h("a", { href: "#/studies" }, "Vizier"), " / ", id),
    h("section", { class: "card" }, heading, summary),
    h("section", { class: "card" }, h("h3", {}, "Trials"), trialsBox));
  const value = (v) => (typeof v === "number" ? (Math.round(v * 1e6) / 1e6).toString() : String(v));
  async function load() {
    const study = await api(path, { signal: pg.signal });
    const trials = [];
    let token = "";
    do {
      const body = await api(`${path}/trials?pageSize=1000${token ? "&pageToken=" + enc(token) : ""}`, { signal: pg.signal });
      trials.push(...(body.trials || []));
      token = body.nextPageToken || "";
    } while (token);
    const optimal = await api(`${path}/trials:listOptimalTrials`, { method: "POST", body: {}, signal: pg.signal });
    const best = new Set((optimal.optimalTrials || []).map((t) => t.name));
    const spec = study.studySpec || {};
    put(heading, study.displayName || `Study ${id}`, " ", chip(study.state, "big"));
    put(summary, h("dl", { class: "fields" },
      h("dt", {}, "Objectives"), h("dd", {}, objectives(spec)),
      h("dt", {}, "Parameters"), h("dd", {}, (spec.parameters || []).map((p) => p.parameterId).join(", ") || "—"),
      h("dt", {}, "Algorithm"), h("dd", {}, algorithmName(spec.algorithm)),
      h("dt", {}, "Trials"), h("dd", { id: "vizier-counts" }, `${trials.length} (${trials.filter((t) => t.state === "SUCCEEDED").length} succeeded, ${best.size} optimal)`),
      h("dt", {}, "Created"), h("dd", {}, timeCell(study.createTime)),
      study.inactiveReason ? [h("dt", {}, "Inactive because"), h("dd", {}, study.inactiveReason)] : null));
    const metricIds = (spec.metrics || []).map((m) => m.metricId);
    const paramIds = (spec.parameters || []).map((p) => p.parameterId);
    put(trialsBox, trials.length ? h("table", { class: "list" },
      h("thead", {}, h("tr", {}, h("th", {}, "Trial"), h("th", {}, "State"), ...paramIds.map((p) => h("th", { class: "num" }, p)),
        ...metricIds.map((m) => h("th", { class: "num" }, m)), h("th", {}, "Client"), h("th", { class: "time" }, "Started"), h("th", { class: "time" }, "Ended"))),
      h("tbody", {}, trials.map((t) => {
        const params = new Map((t.parameters || []).map((p) => [p.parameterId, p.value]));
        const metrics = new Map(((t.finalMeasurement || {}).metrics || []).map((m) => [m.metricId, m.value]));
        return h("tr", { class: `trial${best.has(t.name) ? " best" : ""}`, "data-trial": t.id || lastSegment(t.name) },
          h("td", {}, t.id || lastSegment(t.name), best.has(t.name) ? h("span", { class: "best-tag", title: "on the Pareto front (or the best, with one objective)" }, " ★ optimal") : null),
          h("td", {}, chip(t.state), t.infeasibleReason ? h("div", { class: "why" }, t.infeasibleReason) : null),
          ...paramIds.map((p) => h("td", { class: "num" }, params.has(p) ? value(params.get(p)) : "—")),
          ...metricIds.map((m) => h("td", { class: "num" }, metrics.has(m) ? value(metrics.get(m)) : "—")),
          h("td", {}, t.clientId || ""), h("td", { class: "time" }, timeCell(t.startTime)), h("td", { class: "time" }, timeCell(t.endTime)));
      })))
      : h("p", { class: "muted" }, "No trials yet: a client asks for them with suggest."));
  }
  await load();
  every(pg, 3000, load);
}

// ---------------------------------------------------------------------------------------
// TrainingPipelines: list and page, with the backing CustomJob.

function pipelinesList(pg, q) {
  document.title = "Pipelines · Trainyard";
  const filter = (q.get("filter") || "").trim();
  const table = pagedTable(pg, {
    path: () => base() + "/trainingPipelines?pageSize=100" + (filter ? "&filter=" + enc(filter) : ""),
    collection: "trainingPipelines",
    href: (p) => hashWith(["pipelines", lastSegment(p.name)]),
    empty: filter ? "No pipeline matches this filter." : `No training pipelines in project ${project()} (${region()}).`,
    columns: [
      { h: "Name", cls: "id", cell: (p) => h("a", { href: hashWith(["pipelines", lastSegment(p.name)]), title: p.name }, lastSegment(p.name)) },
      { h: "Display name", cell: (p) => p.displayName || "" },
      { h: "State", cell: (p) => chip(p.state) },
      { h: "Custom job", cell: (p) => { const j = p.trainingTaskMetadata && p.trainingTaskMetadata.backingCustomJob; return j ? resourceLink(j, lastSegment(j)) : "—"; } },
      { h: "Created", cls: "time", cell: (p) => timeCell(p.createTime) },
      { h: "Started", cls: "time", cell: (p) => timeCell(p.startTime) },
      { h: "Ended", cls: "time", cell: (p) => timeCell(p.endTime) },
      { h: "Elapsed", cls: "num", cell: (p) => elapsed(p) },
    ],
  });
  view.append(h("section", { class: "card" }, h("h2", {}, "Training pipelines ", h("span", { class: "muted small" }, `${project()} · ${region()}`)),
    filterBox(q, "pipelines", 'e.g. display_name:"train"', false), table.el));
  every(pg, 3000, () => table.load().catch(saidInTable));
  return table.load(true).catch(saidInTable);
}

async function pipelinePage(pg, id) {
  const name = `projects/${project()}/locations/${region()}/trainingPipelines/${id}`;
  const path = `/v1/${name}`;
  document.title = `Pipeline ${id} · Trainyard`;
  let p = await api(path, { signal: pg.signal });
  const heading = h("h2", {});
  const summary = h("div", {});
  const backing = h("div", { id: "backing-job" });
  const cancel = cancelControl(pg, { path: name, what: "pipeline", isDone: isTerminal(p.state), after: () => refresh() });
  view.append(h("div", { class: "crumbs" }, h("a", { href: "#/pipelines" }, "Pipelines"), " / ", id),
    h("section", { class: "card" }, h("div", { class: "head" }, heading, cancel.el), summary),
    h("section", { class: "card" }, h("h3", {}, "Backing custom job"), backing));
  async function show() {
    put(heading, p.displayName || `Pipeline ${id}`, " ", chip(p.state, "big"));
    const job = p.trainingTaskMetadata && p.trainingTaskMetadata.backingCustomJob;
    put(summary, fields([
      ["Name", h("code", {}, p.name)],
      ["State", chip(p.state)],
      ["Task", h("code", {}, p.trainingTaskDefinition || "—")],
      ["Custom job", job ? resourceLink(job) : h("span", { class: "muted" }, "not created yet")],
      ["Created", timeCell(p.createTime)],
      ["Started", timeCell(p.startTime)],
      ["Ended", timeCell(p.endTime)],
      ["Elapsed", elapsed(p)],
    ]), errorBlock(p.error),
    h("details", {}, h("summary", {}, "Training task inputs"), h("pre", { class: "json" }, JSON.stringify(p.trainingTaskInputs || {}, null, 2))));
    cancel.sync(isTerminal(p.state));
    if (job) {
      try {
        const j = await api(`/v1/${job}`, { signal: pg.signal });
        put(backing, fields([
          ["Job", resourceLink(job, `${lastSegment(job)} · ${j.displayName || ""}`)],
          ["State", chip(j.state)],
          ["Waiting", j.trainyardWaitingReason || null],
          ["Elapsed", elapsed(j)],
        ]), errorBlock(j.error), h("p", {}, h("a", { href: resourceHref(job) }, "Timeline and logs of the job →")));
      } catch (e) {
        if (e.name === "AbortError") return;
        put(backing, h("p", { class: "errtext" }, e.message));
      }
    } else put(backing, h("p", { class: "muted" }, "The pipeline has not created its custom job yet."));
  }
  async function refresh() {
    p = await api(path, { signal: pg.signal });
    await show();
  }
  await show();
  every(pg, 3000, async () => { if (!isTerminal(p.state)) await refresh(); });
}

// ---------------------------------------------------------------------------------------
// Nodes, the queue and quotas (the /v1/admin API; with tokens it needs a "*" token).

/** A bar of allocated / capacity; `shared`: an overcommitted node (past 100% is normal). */
/** GiB, as the storage_gb quota rows give them (MiB below a hundredth of a GiB). */
function gib(x) {
  const g = Number(x);
  return g > 0 && g < 0.01 ? `${(g * 1024).toFixed(2)} MiB` : `${g.toFixed(2)} GiB`;
}
function usage(used, cap, fmt, shared) {
  const u = Number(used) || 0, c = Number(cap) || 0;
  const pct = c ? Math.min(100, (u / c) * 100) : 0;
  const bar = h("span", { class: "bar" + (shared ? " shared" : pct >= 100 ? " full" : pct >= 80 ? " high" : "") });
  const fillEl = h("span", { class: "fill" });
  fillEl.style.width = pct.toFixed(1) + "%";
  bar.append(fillEl);
  return h("span", { class: "usage", title: `${fmt(u)} of ${fmt(c)} allocated` }, bar, ` ${fmt(u)} / ${fmt(c)}`);
}
function accelCell(n) {
  const types = Object.keys(n.accelerators || {});
  if (!types.length) return h("span", { class: "muted" }, "—");
  return types.map((t) => h("div", {}, usage((n.allocated.accelerators || {})[t], n.accelerators[t], String), " ", h("span", { class: "small" }, t)));
}

async function nodesPage(pg) {
  document.title = "Nodes & queue · Trainyard";
  const nodesBox = h("div", { id: "nodes" }, h("p", { class: "muted" }, "Loading…"));
  const queueBox = h("div", { id: "queue" }, h("p", { class: "muted" }, "Loading…"));
  const quotasBox = h("div", { id: "quotas" }, h("p", { class: "muted" }, "Loading…"));
  const usageBox = h("div", { id: "usage" }, h("p", { class: "muted" }, "Loading…"));
  view.append(
    h("section", { class: "card" }, h("h2", {}, "Nodes"), nodesBox),
    h("section", { class: "card" }, h("h2", {}, "Queue ", h("span", { class: "muted small" }, "QUEUED and PENDING jobs, oldest first")), queueBox),
    h("section", { class: "card" }, h("h2", {}, "Quotas"), quotasBox),
    h("section", { class: "card" }, h("h2", {}, "Usage ", h("span", { class: "muted small" }, "the last 7 days, by hour")), usageBox));
  const adminNote = (e) => h("p", { class: "errtext" }, e.message, e.status === 403 || e.status === 401 ? ' The administration API needs a "*" token.' : "");

  async function loadNodes() {
    try {
      const body = await api("/v1/admin/nodes", { signal: pg.signal });
      const nodes = body.nodes || [];
      put(nodesBox, h("table", { class: "list" },
        h("thead", {}, h("tr", {}, ["Node", "State", "CPUs", "Memory", "Accelerators", "GPUs held", "Replicas"].map((x) => h("th", {}, x)))),
        h("tbody", {}, nodes.map((n) => {
          const gpus = n.gpus || [];
          const tr = h("tr", { class: "row", "data-node": n.name },
            h("td", {}, h("a", { href: hashWith(["nodes", n.name]) }, n.name), n.overcommit ? h("span", { class: "muted small", title: "CPU and memory are shared, not exact" }, " overcommit") : ""),
            h("td", {}, chip(n.state), n.degradedReason ? h("div", { class: "why" }, n.degradedReason) : ""),
            h("td", {}, usage(n.allocated && n.allocated.cpus, n.cpus, String, n.overcommit)),
            h("td", {}, usage(n.allocated && n.allocated.memoryBytes, n.memoryBytes, bytes, n.overcommit)),
            h("td", {}, accelCell(n)),
            h("td", { class: "num" }, gpus.length ? `${gpus.filter((g) => g.heldBy).length} / ${gpus.length}` : "—"),
            h("td", { class: "num" }, (n.replicas || []).length));
          tr.addEventListener("click", (ev) => { if (!ev.target.closest("a")) location.hash = hashWith(["nodes", n.name]); });
          return tr;
        }))));
      if (!nodes.length) nodesBox.append(h("p", { class: "muted" }, "No nodes."));
      clearError("nodes");
    } catch (e) {
      if (e.name === "AbortError") return;
      put(nodesBox, adminNote(e));
      report(e, "nodes");
    }
  }

  let projects = [{ project: project(), region: region() }];
  async function loadQuotas() {
    try {
      const body = await api("/v1/admin/quotas", { signal: pg.signal });
      const rows = body.quotas || [];
      const found = new Map([[`${project()}|${region()}`, { project: project(), region: region() }]]);
      for (const r of rows) if (r.project && r.project !== "*") { found.set(`${r.project}|${r.region}`, { project: r.project, region: r.region }); knownProjects.add(r.project); }
      projects = [...found.values()];
      fillDatalist("project");
      put(quotasBox, rows.length ? h("table", { class: "list" },
        h("thead", {}, h("tr", {}, ["Project", "Region", "Metric", "In use", "Queued", "Limit", "Cohort", "Borrowed", "Lent"].map((x) => h("th", {}, x)))),
        h("tbody", {}, rows.map((r) => h("tr", {}, h("td", {}, r.project), h("td", {}, r.region), h("td", {}, h("code", {}, r.metric)),
          h("td", {}, r.limit ? usage(r.inUse, r.limit, r.metric === "storage_gb" ? gib : String) : (r.metric === "storage_gb" ? gib(r.inUse) : r.inUse)),
          h("td", { class: "num" }, r.metric === "storage_gb" ? "—" : r.queued), h("td", { class: "num" }, r.limit ? (r.metric === "storage_gb" ? gib(r.limit) : r.limit) : "no limit"),
          h("td", {}, r.cohort || "—"),
          h("td", { class: "num" }, r.cohort ? r.borrowed + (r.borrowingLimit ? ` (limit ${r.borrowingLimit})` : "") : "—"),
          h("td", { class: "num" }, r.cohort ? r.lent + (r.lendingLimit ? ` (limit ${r.lendingLimit})` : "") : "—")))))
        : h("p", { class: "muted" }, "No quotas are set and no job holds any."));
      const hist = body.usageHistory || [];
      if (hist.length) quotasBox.append(h("h3", {}, "Past use (fair share)"),
        h("table", { class: "list", id: "usage-history" },
          // Numbers right-aligned under right-aligned headers; what each number is, said.
          h("thead", {}, h("tr", {}, h("th", {}, "Project"), h("th", { class: "num", title: "CPUs held, on average" }, "CPUs (average)"),
            h("th", { class: "num", title: "GiB of memory held, on average" }, "Memory GiB (average)"), h("th", {}, "Accelerators (average)"))),
          h("tbody", {}, hist.map((u) => h("tr", {}, h("td", {}, u.project), h("td", { class: "num" }, String(u.cpus)), h("td", { class: "num" }, String(u.memoryGb)),
            h("td", {}, Object.entries(u.accelerators || {}).map(([k, v]) => `${v} × ${k}`).join(", ") || "—"))))),
        h("p", { class: "muted small" }, `What each project held, averaged with weights that halve every ${Math.round(Number(body.usageHalfLifeSecs) / 3600)} h; it counts in the fair-share order.`));
      if (rows.length) quotasBox.append(h("p", { class: "muted small", id: "quota-note" },
        "In use counts what admitted jobs asked for (their machine types), not what they use; storage_gb is what the project's buckets hold (job outputs included), looked at every few seconds. A node marked overcommit (no [node] table in the config) shares its CPUs and memory with the host, so the jobs on it may together ask for more than it has."));
      clearError("quotas");
    } catch (e) {
      if (e.name === "AbortError") return;
      put(quotasBox, adminNote(e));
      report(e, "quotas");
    }
  }

  async function loadQueue() {
    const filter = 'state="JOB_STATE_QUEUED" OR state="JOB_STATE_PENDING"';
    const jobs = [];
    const failures = [];
    await Promise.all(projects.map(async ({ project: p, region: r }) => {
      let token = "", pages = 0;
      try {
        do {
          const body = await api(`/v1/projects/${enc(p)}/locations/${enc(r)}/customJobs?pageSize=1000&filter=${enc(filter)}` + (token ? "&pageToken=" + enc(token) : ""), { signal: pg.signal });
          jobs.push(...(body.customJobs || []));
          token = body.nextPageToken || "";
        } while (token && ++pages < 10);
      } catch (e) {
        if (e.name === "AbortError") throw e;
        failures.push(e.message);
      }
    }));
    jobs.sort((a, b) => parseTime(a.createTime) - parseTime(b.createTime) || Number(lastSegment(a.name)) - Number(lastSegment(b.name)));
    const now = Date.now();
    put(queueBox, 
      jobs.length ? h("table", { class: "list" },
        h("thead", {}, h("tr", {}, ["#", "Job", "Project", "Display name", "State", "Created", "Waiting for", "Why"].map((x) => h("th", {}, x)))),
        h("tbody", {}, jobs.map((j, i) => {
          const m = /^projects\/([^/]+)\//.exec(j.name) || [];
          return h("tr", { "data-name": j.name }, h("td", { class: "num" }, i + 1), h("td", {}, resourceLink(j.name, lastSegment(j.name))), h("td", {}, m[1] || ""),
            h("td", {}, j.displayName || ""), h("td", {}, chip(j.state)), h("td", { class: "time" }, timeCell(j.createTime)),
            h("td", { class: "num" }, duration(now - parseTime(j.createTime))), h("td", { class: "why-full" }, j.trainyardWaitingReason || ""));
        })))
        : h("p", { class: "muted", id: "queue-empty" }, `No job is waiting in ${projects.map((x) => x.project).join(", ")}.`),
      projects.length === 1 ? h("p", { class: "muted small" }, `Queue of project ${project()}; with a "*" token the queue of every project with live jobs is shown.`) : null,
      failures.length ? h("p", { class: "errtext" }, failures.join("; ")) : null);
  }

  async function loadUsage() {
    try {
      const from = new Date(Date.now() - 7 * 24 * 3600e3);
      from.setUTCMinutes(0, 0, 0);
      const body = await api(`/v1/admin/usage?from=${enc(from.toISOString())}`, { signal: pg.signal });
      const rows = body.usage || [];
      if (!rows.length) { put(usageBox, h("p", { class: "muted" }, "No job held capacity in the last 7 days.")); clearError("usage"); return; }
      const byProject = new Map();
      for (const p of body.series || []) {
        if (!byProject.has(p.project)) byProject.set(p.project, []);
        byProject.get(p.project).push(p);
      }
      const n = (x) => (Math.round(x * 1000) / 1000).toString();
      put(usageBox,
        h("table", { class: "list", id: "usage-table" },
          h("thead", {}, h("tr", {}, h("th", {}, "Project"), h("th", {}, "Accelerator"),
            ["Reserved CPU-h", "GPU-h", "Reserved memory GB-h", "Used CPU-h", "Used memory GB-h", "Succeeded", "Failed", "Cancelled", "Preemptions", "GPU-h lost", "Goodput"].map((x) => h("th", { class: "num" }, x)))),
          h("tbody", {}, rows.map((r) => h("tr", {}, h("td", {}, r.project), h("td", {}, r.acceleratorType),
            ...[r.cpuHours, r.gpuHours, r.memoryGbHours, r.usedCpuHours, r.usedMemoryGbHours].map((x) => h("td", { class: "num" }, n(x))),
            ...[r.jobsSucceeded, r.jobsFailed, r.jobsCancelled, r.preemptions].map((x) => h("td", { class: "num" }, String(x))),
            h("td", { class: "num" }, n(r.lostGpuHours)),
            h("td", { class: "num", title: r.goodput == null ? "no job ended" : `productive ${n(r.productiveHours)} h of ${n(r.accountedHours)} h` },
              r.goodput == null ? "–" : `${Math.round(r.goodput * 1000) / 10}%`))))),
        h("div", { class: "usage-charts" }, [...byProject.entries()].map(([p, pts]) => usageChart(p, pts, from.getTime()))),
        h("p", { class: "muted small" }, "Reserved: what the jobs' machine types hold, from placement until their replicas are down. Used: what their cgroups say (memory; CPU where the cgroup accounts it). `trainyard usage` prints the same (table, json, csv)."));
      clearError("usage");
    } catch (e) {
      if (e.name === "AbortError") return;
      put(usageBox, adminNote(e));
      report(e, "usage");
    }
  }

  await Promise.all([loadNodes(), loadQuotas(), loadUsage()]);
  await loadQueue().catch((e) => { if (e.name !== "AbortError") { put(queueBox, h("p", { class: "errtext" }, e.message)); report(e); } });
  every(pg, 3000, async () => { await Promise.all([loadNodes(), loadQuotas()]); await loadQueue(); });
  every(pg, 30000, loadUsage);
}

/** A project's use per hour since `from` (ms): GPU-hours if it used any, else CPU-hours. */
function usageChart(project, points, from) {
  const gpu = points.some((p) => p.gpuHours > 0);
  const key = gpu ? "gpuHours" : "cpuHours";
  const hours = Math.max(1, Math.ceil((Date.now() - from) / 3600e3));
  const vals = new Array(hours).fill(0);
  for (const p of points) {
    const i = Math.floor((Date.parse(p.hour) - from) / 3600e3);
    if (i >= 0 && i < hours) vals[i] += p[key];
  }
  const W = 420, H = 90, max = Math.max(...vals, 1e-9);
  const bw = W / hours;
  const svg = s("svg", { class: "usage-chart", width: W, height: H + 14, viewBox: `0 0 ${W} ${H + 14}`, role: "img", "aria-label": `${project}: ${gpu ? "GPU" : "CPU"}-hours per hour` },
    s("line", { x1: 0, x2: W, y1: H, y2: H, class: "axis" }),
    ...vals.map((v, i) => v > 0 ? s("rect", { x: i * bw, y: H - (v / max) * H, width: Math.max(bw, 1), height: (v / max) * H, class: "usage-bar" }, s("title", {}, `${new Date(from + i * 3600e3).toISOString().slice(0, 13)}h: ${Math.round(v * 1000) / 1000} ${gpu ? "GPU" : "CPU"}-h`)) : null),
    s("text", { x: 0, y: H + 12, class: "small" }, "7 days ago"), s("text", { x: W, y: H + 12, "text-anchor": "end", class: "small" }, "now"));
  return h("figure", { class: "usage-fig" }, h("figcaption", {}, h("strong", {}, project), ` ${gpu ? "GPU" : "CPU"}-hours per hour (peak ${Math.round(max * 1000) / 1000})`), svg);
}

async function nodePage(pg, nodeName) {
  document.title = `Node ${nodeName} · Trainyard`;
  const box = h("div", {});
  view.append(h("div", { class: "crumbs" }, h("a", { href: "#/nodes" }, "Nodes"), " / ", nodeName), h("section", { class: "card" }, box));
  async function load() {
    const n = await api(`/v1/admin/nodes/${enc(nodeName)}`, { signal: pg.signal });
    const gpus = n.gpus || [];
    put(box, 
      h("div", { class: "head" }, h("h2", {}, n.name, " ", chip(n.state, "big"))),
      fields([
        ["CPUs", usage(n.allocated && n.allocated.cpus, n.cpus, String, n.overcommit)],
        ["Memory", usage(n.allocated && n.allocated.memoryBytes, n.memoryBytes, bytes, n.overcommit)],
        ["Accelerators", accelCell(n)],
        ["Capacity", n.overcommit ? "overcommitted (shared with the host)" : "exact"],
        ["Degraded", n.degradedReason || null],
      ]),
      h("h3", {}, "Replicas"),
      (n.replicas || []).length ? h("table", { class: "list" }, h("thead", {}, h("tr", {}, h("th", {}, "Job"), h("th", {}, "Replica"))),
        h("tbody", {}, n.replicas.map((r) => h("tr", {}, h("td", { title: r.job }, resourceLink(r.job, shortJob(r.job))), h("td", {}, r.replica)))))
        : h("p", { class: "muted" }, "No replica runs here."),
      h("h3", {}, "GPUs"),
      gpus.length ? h("table", { class: "list", id: "gpus" }, h("thead", {}, h("tr", {}, ["Index", "Model", "Type", "Memory", "PCI bus", "State", "Held by", "Links"].map((x) => h("th", {}, x)))),
        h("tbody", {}, gpus.map((g) => h("tr", {}, h("td", { class: "num" }, g.index), h("td", {}, g.model || ""), h("td", {}, g.acceleratorType || ""),
          h("td", { class: "num" }, g.memoryMib ? bytes(g.memoryMib * 1048576) : "—"), h("td", {}, h("code", {}, g.pciBusId || "")), h("td", {}, chip(g.state)),
          h("td", {}, g.heldBy ? [resourceLink(g.heldBy.job, lastSegment(g.heldBy.job)), " ", g.heldBy.replica] : h("span", { class: "muted" }, "free")),
          h("td", { class: "small" }, Object.entries(g.links || {}).map(([k, v]) => `${k}: ${v}`).join(", "))))))
        : h("p", { class: "muted" }, "No GPUs on this node."));
  }
  await load();
  every(pg, 3000, load);
}

// ---------------------------------------------------------------------------------------

fillDatalist("project");
// The first console's links (?job=ID) open the job's page.
if (params.has("job")) {
  const job = params.get("job");
  params.delete("job");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + (location.hash || hashWith(["jobs", job])));
}
route();

// ---------------------------------------------------------------------------------------
// Experiments (#/experiments, #/experiments/NAME): Vertex AI Experiments as the SDK keeps
// them (contexts of the project's default metadata store), a run's parameters and metrics
// in a sortable table, chosen runs side by side, and their time series from the
// experiment's TensorBoard on one plot.

function metadataBase() {
  return `${base()}/metadataStores/default`;
}

/** Every page of a list (for the experiment page: a few hundred runs at most). */
async function listAll(path, collection, signal, cap = 2000) {
  const out = [];
  let token = "";
  do {
    const sep = path.includes("?") ? "&" : "?";
    const body = await api(path + (token ? `${sep}pageToken=${enc(token)}` : ""), { signal });
    out.push(...(body[collection] || []));
    token = body.nextPageToken || "";
  } while (token && out.length < cap);
  return out;
}

function experimentsList(pg) {
  document.title = "Experiments · Trainyard";
  const filter = 'schema_title="system.Experiment"';
  const table = pagedTable(pg, {
    path: () => `${metadataBase()}/contexts?filter=${enc(filter)}`,
    collection: "contexts",
    columns: [
      { h: "Experiment", cls: "id", cell: (c) => h("a", { href: `#/experiments/${enc(lastSegment(c.name))}` }, c.displayName || lastSegment(c.name)) },
      { h: "Description", cell: (c) => c.description || "" },
      { h: "TensorBoard", cell: (c) => lastSegment((c.metadata || {}).backing_tensorboard_resource || "") || "—" },
      { h: "Created", cell: (c) => timeCell(c.createTime) },
    ],
    href: (c) => `#/experiments/${enc(lastSegment(c.name))}`,
    empty: "No experiments in this project yet: aiplatform.init(experiment=...) makes one.",
  });
  view.append(h("section", { class: "card" }, h("h2", {}, "Experiments"), table.el));
  return table.load(true);
}

/** A cell's value as sorting sees it: numbers as numbers, missing last. */
function sortKey(v) {
  if (v === undefined || v === null || v === "") return [2, 0];
  return typeof v === "number" ? [0, v] : [1, String(v)];
}

async function experimentPage(pg, id) {
  document.title = `Experiment ${id} · Trainyard`;
  const name = `${metadataBase().slice(4)}/contexts/${id}`;
  const exp = await api(`/v1/${name}`, { signal: pg.signal });
  const filter = `schema_title="system.ExperimentRun" AND parent_contexts:"${name.replace(/^\//, "")}"`;
  const runs = await listAll(`${metadataBase()}/contexts?filter=${enc(filter)}`, "contexts", pg.signal);
  const params = [...new Set(runs.flatMap((r) => Object.keys(((r.metadata || {})._params) || {})))].sort();
  const metrics = [...new Set(runs.flatMap((r) => Object.keys(((r.metadata || {})._metrics) || {})))].sort();
  const columns = [
    { key: "run", h: "Run", get: (r) => r.displayName || lastSegment(r.name) },
    { key: "state", h: "State", get: (r) => (r.metadata || {})._state || "" },
    ...params.map((p) => ({ key: `param.${p}`, h: `param.${p}`, get: (r) => ((r.metadata || {})._params || {})[p] })),
    ...metrics.map((m) => ({ key: `metric.${m}`, h: `metric.${m}`, get: (r) => ((r.metadata || {})._metrics || {})[m] })),
    { key: "created", h: "Created", get: (r) => r.createTime || "" },
  ];
  let sortBy = "created", desc = true;
  const chosen = new Set(runs.map((r) => r.name));
  const tbody = h("tbody");
  const head = h("tr", {});
  const compareBox = h("div", { id: "run-compare" });
  const plotBox = h("div", { class: "plot-box", id: "series-plot" });
  const tagSelect = h("select", { id: "series-tag" });
  const cellText = (v) => (typeof v === "number" ? num(v) : v === undefined ? "—" : String(v));
  function drawTable() {
    put(head, h("th", {}, ""), columns.map((c) => {
      const th = h("th", { class: `sortable${c.key === sortBy ? (desc ? " sorted-desc" : " sorted-asc") : ""}`, "data-key": c.key, title: `Sort by ${c.h}` }, c.h, c.key === sortBy ? (desc ? " ▾" : " ▴") : "");
      th.addEventListener("click", () => { if (sortBy === c.key) desc = !desc; else { sortBy = c.key; desc = false; } drawTable(); });
      return th;
    }));
    const col = columns.find((c) => c.key === sortBy) || columns[0];
    const sorted = [...runs].sort((a, b) => {
      const [ka, va] = sortKey(col.get(a)), [kb, vb] = sortKey(col.get(b));
      if (ka !== kb) return ka - kb;
      const d = va < vb ? -1 : va > vb ? 1 : 0;
      return ka === 2 ? 0 : desc ? -d : d;
    });
    put(tbody, ...sorted.map((r) => {
      const box = h("input", { type: "checkbox", class: "pick", title: "Compare and plot this run" });
      box.checked = chosen.has(r.name);
      box.addEventListener("change", () => { if (box.checked) chosen.add(r.name); else chosen.delete(r.name); drawCompare(); drawPlot(); });
      return h("tr", { class: "run", "data-run": r.displayName || lastSegment(r.name) }, h("td", {}, box), columns.map((c) => h("td", { class: typeof c.get(r) === "number" ? "num" : "" }, c.key === "created" ? timeCell(c.get(r)) : cellText(c.get(r)))));
    }));
    if (!runs.length) tbody.append(h("tr", {}, h("td", { colspan: columns.length + 1, class: "muted empty" }, "No runs yet: aiplatform.start_run(...) makes one.")));
  }
  // The chosen runs side by side: a row per parameter and metric, those that differ marked.
  function drawCompare() {
    const picked = runs.filter((r) => chosen.has(r.name));
    if (picked.length < 2) { put(compareBox, h("p", { class: "muted" }, "Choose two runs or more to compare them.")); return; }
    const rows = columns.filter((c) => c.key.startsWith("param.") || c.key.startsWith("metric."));
    put(compareBox, h("table", { class: "list compare" },
      h("thead", {}, h("tr", {}, h("th", {}, ""), picked.map((r) => h("th", {}, r.displayName || lastSegment(r.name))))),
      h("tbody", {}, rows.map((c) => {
        const vals = picked.map((r) => c.get(r));
        const differ = new Set(vals.map((v) => JSON.stringify(v))).size > 1;
        return h("tr", { class: differ ? "differs" : "", "data-key": c.key }, h("th", {}, c.h), vals.map((v) => h("td", { class: typeof v === "number" ? "num" : "" }, cellText(v))));
      }))));
  }
  // Time series: the experiment's TensorBoard runs (named as the runs), one tag at a time.
  const series = new Map(); // run name -> {tag: [[step, value], ...]}
  async function loadSeries() {
    const tb = (exp.metadata || {}).backing_tensorboard_resource;
    if (!tb) return;
    await Promise.all(runs.map(async (r) => {
      const runPath = `/v1/${tb}/experiments/${enc(id)}/runs/${enc(r.displayName || lastSegment(r.name))}`;
      let list;
      try { list = await listAll(`${runPath}/timeSeries`, "tensorboardTimeSeries", pg.signal, 200); } catch (e) { if (e.status === 404) return; throw e; }
      const byTag = {};
      for (let i = 0; i < list.length; i += 20) {
        const chunk = list.slice(i, i + 20);
        const q = chunk.map((t) => `timeSeries=${enc(t.name)}`).join("&");
        const body = await api(`/v1/${tb}:batchRead?${q}`, { signal: pg.signal });
        (body.timeSeriesData || []).forEach((d) => {
          const t = chunk.find((c) => lastSegment(c.name) === d.tensorboardTimeSeriesId);
          if (t) byTag[t.displayName] = (d.values || []).map((p) => [Number(p.step || 0), Number((p.scalar || {}).value)]).filter((p) => Number.isFinite(p[1]));
        });
      }
      series.set(r.name, byTag);
    }));
    const tags = [...new Set([...series.values()].flatMap((m) => Object.keys(m)))].sort();
    put(tagSelect, tags.map((t) => h("option", { value: t }, t)));
    if (!tags.length) put(tagSelect, h("option", { value: "" }, "(no time series)"));
  }
  function drawPlot() {
    const tag = tagSelect.value;
    const lines = runs.filter((r) => chosen.has(r.name) && series.get(r.name) && (series.get(r.name)[tag] || []).length)
      .map((r) => ({ run: r.displayName || lastSegment(r.name), pts: series.get(r.name)[tag] }));
    if (!lines.length) { put(plotBox, h("p", { class: "muted" }, tag ? `No chosen run has ${tag}.` : "No time series in this experiment yet: aiplatform.log_time_series_metrics(...) writes them.")); return; }
    const W = Math.max(480, Math.floor(plotBox.clientWidth || 800)), H = 280, L = 64, R = 18, T = 16, B = 40;
    const steps = lines.flatMap((l) => l.pts.map((p) => p[0])), vals = lines.flatMap((l) => l.pts.map((p) => p[1]));
    const xt = niceTicks(Math.min(...steps), Math.max(...steps), 6), yt = niceTicks(Math.min(...vals), Math.max(...vals), 5);
    const xs = (v) => L + ((v - xt.lo) / (xt.hi - xt.lo)) * (W - L - R), ys = (v) => T + (1 - (v - yt.lo) / (yt.hi - yt.lo)) * (H - T - B);
    const svg = s("svg", { class: "plot", id: "series-plot-svg", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${tag} by step` });
    const axis = s("g", { class: "axis" });
    for (const v of yt.ticks) axis.append(s("line", { x1: L, x2: W - R, y1: ys(v), y2: ys(v), class: "grid" }), s("text", { x: L - 6, y: ys(v) + 4, "text-anchor": "end" }, num(v, 3)));
    for (const v of xt.ticks) axis.append(s("text", { x: xs(v), y: H - B + 16, "text-anchor": "middle" }, String(v)));
    axis.append(s("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "base" }), s("line", { x1: L, x2: L, y1: T, y2: H - B, class: "base" }),
      s("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-title" }, "step"),
      s("text", { x: 14, y: (T + H - B) / 2, "text-anchor": "middle", class: "axis-title", transform: `rotate(-90 14 ${(T + H - B) / 2})` }, tag));
    svg.append(axis);
    lines.forEach((l, i) => {
      const d = [...l.pts].sort((a, b) => a[0] - b[0]).map((p, j) => `${j ? "L" : "M"}${xs(p[0]).toFixed(1)} ${ys(p[1]).toFixed(1)}`).join("");
      svg.append(s("path", { d, class: `ts ts-${i % 8}`, "data-run": l.run }, title(`${l.run}: ${tag}, ${l.pts.length} points, last ${num(l.pts[l.pts.length - 1][1])}`)));
    });
    put(plotBox, svg, h("div", { class: "legend" }, lines.map((l, i) => h("span", { class: "key" }, s("svg", { width: 18, height: 10 }, s("path", { d: "M0 5H18", class: `ts ts-${i % 8}` })), ` ${l.run}`))));
  }
  tagSelect.addEventListener("change", drawPlot);
  view.append(h("div", { class: "crumbs" }, h("a", { href: "#/experiments" }, "Experiments"), " / ", id),
    h("section", { class: "card" }, h("h2", {}, exp.displayName || id), fields([
      ["Description", exp.description || "—"],
      ["Runs", String(runs.length)],
      ["TensorBoard", (exp.metadata || {}).backing_tensorboard_resource || "—"],
      ["Created", timeCell(exp.createTime)],
    ])),
    h("section", { class: "card" }, h("h3", {}, "Runs"), h("table", { class: "list runs", id: "runs" }, h("thead", {}, head), tbody)),
    h("section", { class: "card" }, h("h3", {}, "Compare"), compareBox),
    h("section", { class: "card" }, h("div", { class: "head" }, h("h3", {}, "Time series"), h("label", {}, "Metric ", tagSelect)), plotBox));
  drawTable();
  drawCompare();
  await loadSeries();
  drawPlot();
}
