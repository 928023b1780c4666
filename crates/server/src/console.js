// The web console (served as /console.js: the Content-Security-Policy allows no inline
// script). Project and region come from the page's URL or are remembered in localStorage;
// the token is typed in, kept in sessionStorage (this tab only, gone when it closes) and
// never read from the URL.
"use strict";
const $ = (id) => document.getElementById(id);
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
  const v = store.getItem("trainyard." + k) || (k === "token" ? null : params.get(k));
  if (v) $(k).value = v;
  $(k).addEventListener("change", () => { store.setItem("trainyard." + k, $(k).value); refresh(); });
}
let selected = params.get("job");
const base = () => `/v1/projects/${encodeURIComponent($("project").value)}/locations/${encodeURIComponent($("region").value)}`;
const headers = () => $("token").value ? { Authorization: "Bearer " + $("token").value } : {};
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
async function api(path) {
  const r = await fetch(base() + path, { headers: headers() });
  if (!r.ok) { const e = await r.json().catch(() => ({})); throw new Error(e.error ? `${e.error.status}: ${e.error.message}` : r.statusText); }
  return r;
}
async function refresh() {
  try {
    const body = await (await api("/customJobs?pageSize=100")).json();
    $("error").textContent = "";
    $("jobs").innerHTML = (body.customJobs || []).map((j) => {
      const id = esc(j.name.split("/").pop());
      const state = esc(j.state);
      return `<tr class="job ${id === selected ? "sel" : ""}" data-id="${id}"><td>${id}</td><td>${esc(j.displayName)}</td>` +
        `<td><span class="st ${state}">${state.replace("JOB_STATE_", "")}</span></td><td class="muted">${esc(j.createTime)}</td></tr>`;
    }).join("");
    for (const tr of document.querySelectorAll("tr.job")) tr.onclick = () => { selected = tr.dataset.id; refresh(); };
    if (selected) await detail(selected);
  } catch (e) { $("error").textContent = e.message; }
}
async function detail(id) {
  const path = `/customJobs/${encodeURIComponent(id)}`;
  const j = await (await api(path)).json();
  const text = await (await api(`${path}/logs`)).text();
  const lines = text.split("\n").filter(Boolean).map((l) => JSON.parse(l)).map((e) => {
    const cls = e.stream === "event" ? "ev" : e.stream === "stderr" ? "err" : "";
    return `<span class="${cls}">${esc(e.time.slice(11, 23))} ${esc(e.replica)}${e.restart ? "#" + esc(e.restart) : ""}: ${esc(e.text)}</span>`;
  });
  const state = esc(j.state);
  const pools = (j.jobSpec.workerPoolSpecs || []).map((p, i) => `pool ${i}: ${esc(p.replicaCount || 0)} x ${esc(p.machineSpec?.machineType)}`).join("<br>");
  $("detail").innerHTML = `<h3>${esc(j.displayName)} <span class="st ${state}">${state.replace("JOB_STATE_", "")}</span></h3>` +
    `<p class="muted">${esc(j.name)}<br>${pools}</p>` +
    (j.trainyardWaitingReason ? `<p>Waiting: ${esc(j.trainyardWaitingReason)}</p>` : "") +
    (j.error ? `<p class="errtext">Error ${esc(j.error.code)}: ${esc(j.error.message)}</p>` : "") +
    `<pre>${lines.join("\n")}</pre>`;
}
refresh();
setInterval(refresh, 2000);
