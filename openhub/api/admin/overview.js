// The overview tab: the store's figures every 5 s, the workers every 15 s (a ping costs its timeout).
// Uses api(), cell(), stateCell(), fmt() and showMessage() from admin.js.
"use strict";

const OVERVIEW_EVERY_MS = 5000;
const WORKERS_EVERY_MS = 15000;
let overviewTimer = null;
let workersTimer = null;

function ageText(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.round(seconds);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.floor(s / 60) + " min";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function messageLink(td, id) {
  const a = document.createElement("a");
  a.href = "#message-" + id;
  a.textContent = "#" + id;
  a.className = "message-link";
  a.dataset.id = id;
  a.addEventListener("click", (ev) => { ev.preventDefault(); showMessage(id); });
  td.textContent = "";
  td.appendChild(a);
}

function renderOverview(o) {
  const pct = (v) => (v * 100).toFixed(1) + " %";
  const hour = o.finished.hour_total, day = o.finished.day_total;
  $("#ov-hour-finished").textContent = hour.finished;
  $("#ov-hour-failure").textContent = pct(hour.failure_rate);
  $("#ov-day-finished").textContent = day.finished;
  $("#ov-day-failure").textContent = pct(day.failure_rate);
  $("#ov-live").textContent = Object.values(o.live_by_state).reduce((a, b) => a + b, 0);
  $("#ov-parked").textContent = o.confirmations.parked_count;
  $("#ov-paused").textContent = o.paused_routes.length;
  $("#ov-updated").textContent = fmt(o.now);

  const throughput = [{ key: "per_minute", label: "finished/min", cls: "finished" }];
  const failures = [{ key: "failure_rate", label: "failed share", cls: "failed" }];
  const pctAxis = (v) => Math.round(v * 100) + "%";
  lineChart($("#chart-hour-throughput"), { title: "Finished per minute, last hour", points: o.finished.hour,
    series: throughput });
  lineChart($("#chart-hour-failures"), { title: "Failure rate, last hour", points: o.finished.hour,
    series: failures, yMax: 1, yFormat: pctAxis });
  lineChart($("#chart-day-throughput"), { title: "Finished per minute, last day (15 min)",
    points: o.finished.day, series: throughput });
  lineChart($("#chart-day-failures"), { title: "Failure rate, last day (15 min)", points: o.finished.day,
    series: failures, yMax: 1, yFormat: pctAxis });

  // Route × state counts: live states in full, final ones finished in the last day.
  const states = ["NEW", "IN_QUEUE", "PROCESSING", "WAITING", "WAITING_FOR_RES", "PARTLY_FAILED", "POSTPONED",
    "OK", "FAILED", "CANCEL", "SKIPPED"];
  const byRoute = {};
  o.routes.forEach((r) => { (byRoute[r.route] = byRoute[r.route] || {})[r.state] = r.count; });
  const head = $("#ov-states thead tr");
  head.textContent = "";
  ["route", ...states].forEach((s) => { const th = document.createElement("th"); th.textContent = s; head.appendChild(th); });
  const body = $("#ov-states tbody");
  body.textContent = "";
  Object.keys(byRoute).sort().forEach((route) => {
    const tr = document.createElement("tr");
    tr.dataset.route = route;
    cell(tr, route);
    states.forEach((s) => {
      const td = cell(tr, byRoute[route][s] || "");
      td.dataset.state = s;
      if (byRoute[route][s]) td.className = "count state-" + s;
    });
    body.appendChild(tr);
  });
  $("#ov-states-empty").hidden = o.routes.length > 0;

  const oldest = $("#ov-oldest tbody");
  oldest.textContent = "";
  o.routes.filter((r) => !r.final).sort((a, b) => b.oldest_age_seconds - a.oldest_age_seconds).forEach((r) => {
    const tr = document.createElement("tr");
    tr.dataset.route = r.route; tr.dataset.state = r.state;
    cell(tr, r.route); stateCell(tr, r.state); cell(tr, r.count);
    cell(tr, ageText(r.oldest_age_seconds)); cell(tr, fmt(r.oldest_received_at));
    messageLink(cell(tr, ""), r.oldest_id);
    oldest.appendChild(tr);
  });
  noneRow(oldest);

  const parked = $("#ov-parked-list tbody");
  parked.textContent = "";
  o.confirmations.parked.forEach((c) => {
    const tr = document.createElement("tr");
    messageLink(cell(tr, ""), c.message_id);
    cell(tr, c.outcome); cell(tr, c.attempts); cell(tr, fmt(c.updated_at));
    cell(tr, c.last_error);  // its one line (openhub.context.error_line); the whole text: the message's detail
    const send = document.createElement("button");
    send.textContent = "Send again";
    send.className = "resend";
    send.dataset.needs = "operator";
    send.addEventListener("click", () => resendConfirmations(`/api/v1/confirmations/${c.id}/resend`));
    cell(tr, "").appendChild(send);
    parked.appendChild(tr);
  });
  noneRow(parked);
  $("#ov-resend-parked").hidden = o.confirmations.parked_count === 0;
  const other = Object.entries(o.confirmations.by_state).filter(([s]) => s !== "FAILED_END");
  $("#ov-confirmations-other").textContent = other.length
    ? "Not yet confirmed: " + other.map(([s, n]) => `${s} ${n}`).join(", ") : "Every other confirmation is done.";

  const paused = $("#ov-paused-list");
  paused.textContent = "";
  o.paused_routes.forEach((p) => {
    const li = document.createElement("li");
    li.textContent = `${p.route} — since ${fmt(p.paused_at)}${p.reason ? ": " + p.reason : ""}`;
    paused.appendChild(li);
  });
  const breakers = $("#ov-breakers");
  breakers.textContent = "";
  o.open_breakers.forEach((b) => breakers.appendChild(Object.assign(document.createElement("li"),
    { textContent: `${b.system}: ${b.failures} failures in a row; next trial after ${fmt(b.open_until)}`
      + (b.reason ? ` (opened by an operator: ${b.reason})` : "") })));
  if (!o.open_breakers.length) breakers.appendChild(Object.assign(document.createElement("li"), { textContent: "none" }));
  const backlogs = $("#ov-backlogs");
  backlogs.textContent = "";
  (o.backlogs || []).forEach((b) => backlogs.appendChild(Object.assign(document.createElement("li"),
    { textContent: `${b.source_system || "route " + b.route}: ${b.backlog} of ${b.limit} not yet final`
      + (b.backlog >= b.limit ? " (full: submissions answer 429)" : "") })));
  if (!(o.backlogs || []).length) backlogs.appendChild(Object.assign(document.createElement("li"), { textContent: "no caps" }));
  if (o.draining) {
    paused.prepend(Object.assign(document.createElement("li"),
      { id: "ov-draining", textContent: `Every route: the hub is draining (${o.draining}); new messages are refused`
        + (o.drain_holds_retries === false ? ", the stored ones go on" : "") }));
  }
  if (!o.paused_routes.length && !o.draining) paused.appendChild(Object.assign(document.createElement("li"), { textContent: "none" }));
}

// A load started before an operator's action may answer after the load the action starts: only the latest
// load renders, or the page would show the state from before the action until the next refresh.
let overviewSeq = 0;
let workersSeq = 0;

async function loadOverview() {
  clearTimeout(overviewTimer);
  const seq = ++overviewSeq;
  try {
    const o = await api("GET", "/api/v1/overview");
    if (seq !== overviewSeq) return;
    renderOverview(o);
    showError("");
  } catch (e) { if (seq === overviewSeq) showError(e.message); }
  if (!$("#tab-overview").hidden && token()) overviewTimer = setTimeout(loadOverview, OVERVIEW_EVERY_MS);
}

async function resendConfirmations(path) {
  try {
    await api("POST", path);
    showError("");
  } catch (e) { showError(e.message); }
  loadOverview();
}

async function loadWorkers() {
  clearTimeout(workersTimer);
  const seq = ++workersSeq;
  try {
    const w = await api("GET", "/api/v1/workers");
    if (seq !== workersSeq) return;
    const el = $("#ov-workers");
    el.textContent = !w.available ? "unknown: the broker could not be asked"
      : (w.workers.length ? w.workers.join(", ") : "none answered");
    $("#ov-workers-count").textContent = w.available ? w.workers.length : "?";
    renderWorkerStates(w.states || []);
  } catch (e) { if (seq === workersSeq) showError(e.message); }
  if (!$("#tab-overview").hidden && token()) workersTimer = setTimeout(loadWorkers, WORKERS_EVERY_MS);
}

// Each worker's state from its heartbeats (taking work, finishing, stopped, store away, gone), and an
// operator's "finish what you have, take nothing new" for it or its host, and back.
function renderWorkerStates(states) {
  const tbody = $("#ov-worker-states tbody");
  tbody.textContent = "";
  states.forEach((s) => {
    const tr = document.createElement("tr");
    tr.dataset.worker = s.id;
    tr.dataset.host = s.host;
    cell(tr, s.node); cell(tr, s.state); cell(tr, s.in_flight); cell(tr, fmt(s.last_seen));
    cell(tr, s.held ? `${s.host_held ? "its host, " : ""}by ${s.held_by || "?"}: ${s.reason || ""}` : "");
    const td = cell(tr, "");
    const button = (label, cls, path, ask) => {
      const btn = document.createElement("button");
      btn.textContent = label; btn.className = cls; btn.dataset.needs = "operator";
      btn.addEventListener("click", async () => {
        let body;
        if (ask) {
          const reason = window.prompt(ask);
          if (!reason) return;
          body = { reason };
        }
        try { await api("POST", path, body); showError(""); } catch (e) { showError(e.message); }
        loadWorkers();
      });
      td.appendChild(btn);
    };
    const worker = `/api/v1/workers/${encodeURIComponent(s.id)}`;
    const host = `/api/v1/hosts/${encodeURIComponent(s.host)}`;
    if (s.worker_held) button("Take work again", "worker-resume", `${worker}:resume`);
    else button("Finish", "worker-finish", `${worker}:finish`, `Why should ${s.node} finish what it has and take nothing new?`);
    if (s.host_held) button("Host takes work again", "host-resume", `${host}:resume`);
    else button("Finish host", "host-finish", `${host}:finish`, `Why should every worker of ${s.host} finish what it has?`);
    tbody.appendChild(tr);
  });
  noneRow(tbody);
}

function startOverview() { loadOverview(); loadWorkers(); }
function stopOverview() { clearTimeout(overviewTimer); clearTimeout(workersTimer); }

function renderExchanges(list) {
  const box = $("#d-http");
  box.textContent = "";
  $("#d-http-none").hidden = list.length > 0;
  list.forEach((x) => {
    const d = document.createElement("details");
    d.className = "exchange";
    d.dataset.step = x.step; d.dataset.attempt = x.attempt;
    const s = document.createElement("summary");
    const status = x.status === null ? "no response: " + (x.error || "") : String(x.status);
    s.textContent = `${x.step} · attempt ${x.attempt} · ${x.method} ${x.url} → ${status} · ${x.duration_ms} ms · ${fmt(x.at)}`;
    d.appendChild(s);
    [["Request", x.request_headers, x.request_body], ["Response", x.response_headers, x.response_body]]
      .forEach(([title, headers, bodyText]) => {
        const h = document.createElement("h4"); h.textContent = title; d.appendChild(h);
        const pre = document.createElement("pre");
        pre.className = title.toLowerCase();
        pre.textContent = Object.entries(headers || {}).map(([k, v]) => `${k}: ${v}`).join("\n")
          + (bodyText ? "\n\n" + bodyText : "");
        d.appendChild(pre);
      });
    box.appendChild(d);
  });
}
