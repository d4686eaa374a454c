// openhub admin page: plain JS over the HTTP API, no build step.
// The admin token lives in sessionStorage (this tab only) and goes out as a Bearer token.
"use strict";

const TOKEN_KEY = "openhub.adminToken";
const $ = (sel) => document.querySelector(sel);
let cursor = null;
let current = null; // id of the message shown in the detail pane
let refreshTimer = null;
let showSeq = 0; // the newest showMessage: an older one's answer arriving late is not shown
let routeSteps = {}; // route name -> its step keys (for "restart from step")
const FINAL = ["OK", "FAILED", "CANCEL", "SKIPPED"];

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function showError(text) {
  const el = $("#error");
  el.textContent = text || "";
  el.hidden = !text;
}

async function api(method, path, body) {
  const headers = { "Authorization": "Bearer " + token() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (r.status === 401) {
    logout();
    throw new Error("The token was refused (" + r.status + "): " + ((data && data.detail) || ""));
  }
  if (r.status === 403) throw new Error("Not allowed for this token (403): " + ((data && data.detail) || ""));
  if (!r.ok) throw new Error(r.status + ": " + ((data && data.detail) || r.statusText));
  return data;
}

function cell(tr, text) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  tr.appendChild(td);
  return td;
}

// An empty table says "none", as the lists beside it do, instead of showing bare headers.
function noneRow(tbody) {
  if (tbody.rows.length) return;
  const tr = document.createElement("tr");
  const td = cell(tr, "none");
  td.colSpan = tbody.closest("table").tHead.rows[0].cells.length;
  td.className = "none";
  tbody.appendChild(tr);
}

function stateCell(tr, state) {
  const td = cell(tr, "");
  const span = document.createElement("span");
  span.className = "state " + state;
  span.textContent = state;
  td.appendChild(span);
}

function fmt(ts) { return ts ? ts.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z") : ""; }

function messageRow(tbody, m, failed) {
  const tr = document.createElement("tr");
  tr.className = "clickable";
  tr.dataset.id = m.id;
  cell(tr, m.id); cell(tr, m.route); stateCell(tr, m.state); cell(tr, m.source_system); cell(tr, m.correlation_id);
  if (failed) {
    cell(tr, m.failed_step);
    cell(tr, m.failed_error);  // the summary's one line (openhub.context.error_line)
  } else {
    cell(tr, m.object_id); cell(tr, m.failed_count);
  }
  cell(tr, fmt(m.received_at));
  tr.addEventListener("click", () => showMessage(m.id));
  tbody.appendChild(tr);
}

function searchQuery() {
  const form = new FormData($("#search-form"));
  const q = new URLSearchParams();
  for (const [k, v] of form.entries()) {
    if (!v) continue;
    // datetime-local has no zone: the operator types UTC, as the table shows.
    q.set(k, (k === "received_from" || k === "received_to") ? v + "Z" : v);
  }
  return q;
}

let searchSeq = 0;  // the newest search: an older one's answer arriving late is not shown

async function search(more) {
  showError("");
  const seq = ++searchSeq;
  const q = searchQuery();
  if (more && cursor) q.set("cursor", cursor);
  try {
    const page = await api("GET", "/api/v1/messages?" + q.toString());
    if (seq !== searchSeq) return;
    const tbody = $("#results tbody");
    if (!more) tbody.textContent = "";
    page.items.forEach((m) => messageRow(tbody, m, false));
    cursor = page.next_cursor;
    $("#more").hidden = !cursor;
    if (!more) {
      q.delete("limit");
      const count = await api("GET", "/api/v1/messages:count?" + q.toString());
      if (seq !== searchSeq) return;
      $("#search-total").textContent = `${count.total} message${count.total === 1 ? "" : "s"} match`;
      $("#search-bulk").hidden = count.total === 0 || q.toString() === "";  // a bulk action needs a filter
      $("#bulk-result").textContent = "";
    }
  } catch (e) { showError(e.message); }
}

async function bulk(action) {
  const q = searchQuery();
  q.delete("limit");
  const body = Object.fromEntries(q.entries());
  const what = action === "restart" ? "Restart every OK, FAILED or CANCEL message" : "Cancel every message not final yet";
  if (!window.confirm(`${what} matching this search (up to 1000)?`)) return;
  try {
    const r = await api("POST", `/api/v1/messages:${action}`, body);
    await search(false);
    $("#bulk-result").textContent = `${r.done.length} ${action === "restart" ? "restarted" : "cancelled"}` +
      (r.refused.length ? `, ${r.refused.length} had moved on` : "") + (r.more ? "; more match: run it again" : "");
  } catch (e) { showError(e.message); }
}

async function loadFailed() {
  showError("");
  try {
    const page = await api("GET", "/api/v1/messages?state=FAILED&limit=200");
    const tbody = $("#failed tbody");
    tbody.textContent = "";
    page.items.forEach((m) => messageRow(tbody, m, true));
    noneRow(tbody);
  } catch (e) { showError(e.message); }
}

async function loadRoutes() {
  showError("");
  try {
    const routes = await api("GET", "/api/v1/routes");
    const tbody = $("#routes tbody");
    tbody.textContent = "";
    routes.forEach((r) => {
      const tr = document.createElement("tr");
      tr.dataset.route = r.route;
      cell(tr, r.route);
      cell(tr, r.steps.map((s) => s.key).join(" → "));
      cell(tr, r.paused ? "paused" : "");
      cell(tr, r.paused_reason);
      const td = cell(tr, "");
      const b = document.createElement("button");
      b.textContent = r.paused ? "Resume" : "Pause";
      b.className = r.paused ? "resume" : "pause";
      b.dataset.needs = "operator";
      b.addEventListener("click", async () => {
        const [service, ...rest] = r.route.split(".");
        try {
          await api("POST", `/api/v1/routes/${encodeURIComponent(service)}/${encodeURIComponent(rest.join("."))}/${r.paused ? "resume" : "pause"}`);
          await loadRoutes();
        } catch (e) { showError(e.message); }
      });
      td.appendChild(b);
      tbody.appendChild(tr);
    });
  } catch (e) { showError(e.message); }
}

// The error-code catalogue (GET /api/v1/errors); a count links to the messages search by that code.
async function loadErrors() {
  showError("");
  try {
    const entries = await api("GET", "/api/v1/errors");
    const tbody = $("#errors tbody");
    tbody.textContent = "";
    entries.forEach((e) => {
      const tr = document.createElement("tr");
      tr.dataset.code = e.code;
      cell(tr, e.declared ? e.code : e.code + " (undeclared)");
      cell(tr, e.retried);
      const td = cell(tr, e.messages === null ? "" : e.messages);
      if (e.search && e.messages) {
        td.textContent = "";
        const a = document.createElement("a");
        a.href = "#";
        a.className = "search-code";
        a.textContent = String(e.messages);
        a.addEventListener("click", (ev) => {
          ev.preventDefault();
          $("#search-form").reset();
          $("#search-form").elements.error_code.value = e.code;
          selectTab("search");
          search(false);
        });
        td.appendChild(a);
      }
      cell(tr, e.origin);
      cell(tr, e.meaning);
      cell(tr, e.action);
      tbody.appendChild(tr);
    });
    noneRow(tbody);
  } catch (e) { showError(e.message); }
}

// An error as one line (openhub.context.error_line); where the stored text says more (a traceback, a
// longer body), a click on the line unfolds the whole of it (kept open across the detail's refreshes).
function errorCell(tr, line, whole, key, opened) {
  if (!whole || whole.trim() === line) return cell(tr, line);
  const td = cell(tr, "");
  const box = document.createElement("details"), summary = document.createElement("summary");
  const pre = document.createElement("pre");
  box.className = "error";
  box.dataset.key = key;
  box.open = opened.has(key);
  summary.textContent = line;
  pre.textContent = whole;
  box.append(summary, pre);
  td.appendChild(box);
  return td;
}

function fillTable(sel, rows, columns) {
  const tbody = $(sel + " tbody");
  const opened = new Set(Array.from(tbody.querySelectorAll("details.error[open]"), (d) => d.dataset.key));
  tbody.textContent = "";
  rows.forEach((row, i) => {
    const tr = document.createElement("tr");
    columns.forEach((c) => {
      if (c === "state" || c === "to_state") return stateCell(tr, row[c]);
      if (c === "last_error" && row[c]) {
        return errorCell(tr, row.last_error_line || row[c], row[c], `${current}:${i}`, opened);
      }
      cell(tr, /(_at|^at)$/.test(c) ? fmt(row[c]) : row[c]);
    });
    tbody.appendChild(tr);
  });
  return tbody;
}

async function showMessage(id, quiet) {
  if (!quiet) showError("");
  clearTimeout(refreshTimer);  // the live refresh of the message shown before must not follow this call
  const seq = ++showSeq;
  try {
    const m = await api("GET", "/api/v1/messages/" + encodeURIComponent(id));
    // A slow answer for the message shown before (its live refresh, or the one an action re-read) must not
    // put it back over the one opened since: the next action would go to it.
    if (seq !== showSeq) return;
    current = m.id;
    $("#detail").hidden = false;
    $("#d-id").textContent = m.id;
    const st = $("#d-state");
    st.textContent = m.state;
    st.className = "state " + m.state;
    // Retried and then OK: the stored error is an earlier attempt's, not the message's failure.
    const past = m.state === "OK" && Boolean(m.failed_error);
    const fields = [["route", m.route], ["correlation id", m.correlation_id], ["source system", m.source_system],
      ["object id", m.object_id], ["entity type", m.entity_type], ["process id", m.process_id],
      ["parent", m.parent_id], ["priority", m.priority], ["failed count", m.failed_count],
      [past ? "step that failed earlier" : "failed step", m.failed_step],
      ["received", fmt(m.received_at)], ["message timestamp", fmt(m.msg_timestamp)], ["finished", fmt(m.finished_at)],
      ["funnel", m.funnel], ["trace", m.trace_id]];
    const ftbody = $("#d-fields tbody");
    ftbody.textContent = "";
    fields.forEach(([k, v]) => {
      const tr = document.createElement("tr");
      const th = document.createElement("th"); th.textContent = k; tr.appendChild(th);
      // The trace id links to the tracing UI when OPENHUB_TRACE_URL is set (only http(s) links are made).
      if (k === "parent" && v) {  // its split parent or fan-out family, a click away
        const td = document.createElement("td"), a = document.createElement("a");
        a.href = "#"; a.textContent = v; a.id = "d-parent";
        a.addEventListener("click", (e) => { e.preventDefault(); showMessage(v); });
        td.appendChild(a); tr.appendChild(td);
      } else if (k === "trace" && v && /^https?:\/\//.test(m.trace_url || "")) {
        const td = document.createElement("td"), a = document.createElement("a");
        a.href = m.trace_url; a.textContent = v; a.id = "d-trace"; a.target = "_blank"; a.rel = "noopener";
        td.appendChild(a); tr.appendChild(td);
      } else {
        cell(tr, v);
      }
      ftbody.appendChild(tr);
    });
    $("#d-error-line").textContent = m.failed_error_line || "—";
    $("#d-error").textContent = m.failed_error || "";
    $("#d-error-title").textContent = past ? "Error of an earlier attempt (the message then ended OK)" : "Last error";
    // The whole text is a click away, where it says more than its line (a traceback, a longer body).
    const box = $("#d-error-box"), shown = String(m.id);  // a refresh keeps what the reader opened
    box.hidden = !m.failed_error || m.failed_error.trim() === m.failed_error_line;
    if (box.dataset.shown !== shown) { box.open = false; box.dataset.shown = shown; }
    $("#d-payload").textContent = JSON.stringify(m.payload, null, 2);
    $("#d-business").textContent = m.business_errors.length ? JSON.stringify(m.business_errors, null, 2) : "—";
    noneRow(fillTable("#d-calls", m.ext_calls, ["step", "key", "state", "attempts", "worker", "duration_ms",
      "updated_at", "last_error"]));
    noneRow(fillTable("#d-history", m.history, ["at", "event", "from_state", "to_state", "step", "detail"]));
    // A topic's message (fan-out, issue 37): its children are its receivers, one per subscribed route.
    const family = m.history.some((h) => h.event === "fanned_out");
    $("#d-children-title").textContent = family ? "Receivers (fan-out family: one message per subscribed route)" : "Children";
    const children = fillTable("#d-children", m.children, ["id", "route", "state", "object_id"]);
    Array.from(children.rows).forEach((tr, i) => {
      tr.className = "clickable";
      tr.addEventListener("click", () => showMessage(m.children[i].id));
    });
    noneRow(children);
    noneRow(fillTable("#d-confirmation", m.confirmation, ["outcome", "state", "attempts", "updated_at",
      "last_error"]));
    renderExchanges(m.http_exchanges || []);
    noneRow(fillTable("#d-audit", (m.operator_actions || []).map((a) => ({ ...a, at: fmt(a.at) })),
      ["at", "who", "action", "target", "old_value", "new_value"]));
    const final = ["OK", "FAILED", "CANCEL"].includes(m.state);
    $("#d-restart").disabled = !final;
    $("#d-restart-total").disabled = !final;
    const select = $("#d-from-step");
    select.textContent = "";
    (routeSteps[m.route] || []).forEach((key) => select.appendChild(Object.assign(document.createElement("option"),
      { value: key, textContent: key })));
    select.disabled = !final; $("#d-restart-from").disabled = !final;
    $("#d-retry").disabled = !["PARTLY_FAILED", "POSTPONED"].includes(m.state);
    const editable = m.state === "FAILED", editBox = $("#d-edit-box");
    if (editBox.hidden !== !editable || editBox.dataset.shown !== String(m.id)) {  // a refresh keeps the typing
      $("#d-edit").value = JSON.stringify(m.payload, null, 2);
      editBox.dataset.shown = String(m.id);
    }
    editBox.hidden = !editable;
    $("#d-cancel").disabled = FINAL.includes(m.state);
    // A message on its way is followed live until it reaches a final state.
    clearTimeout(refreshTimer);
    if (!FINAL.includes(m.state)) {
      // Only while no other showMessage was called since this one: a refresh fired while the answer for a
      // newly opened message was on its way took the detail (and the next action) back to this message.
      refreshTimer = setTimeout(() => { if (current === m.id && seq === showSeq) showMessage(m.id, true); }, 1000);
    }
    if (!quiet) $("#detail").scrollIntoView();
  } catch (e) { showError(e.message); }
}

async function act(action, body, confirmText) {
  if (current === null) return;
  if (confirmText && !window.confirm(confirmText)) return;
  try {
    await api("POST", `/api/v1/messages/${current}:${action}`, body);
    await showMessage(current);
  } catch (e) { showError(e.message); }
}

async function resubmit() {
  let payload;
  try { payload = JSON.parse($("#d-edit").value); } catch (e) { showError("The payload is not JSON: " + e.message); return; }
  await act("resubmit", { payload }, "Replace the payload and restart this message?");
}

async function loadRouteSteps() {
  const list = await api("GET", "/api/v1/routes");
  routeSteps = Object.fromEntries(list.map((r) => [r.route, r.steps.map((s) => s.key)]));
  return list;
}

async function loadBreakers() {
  try {
    const tbody = $("#breakers tbody");
    tbody.textContent = "";
    (await api("GET", "/api/v1/breakers")).forEach((b) => {
      const tr = document.createElement("tr");
      tr.dataset.system = b.system;
      cell(tr, b.system);
      cell(tr, b.open ? "open until " + fmt(b.open_until) : "closed");
      cell(tr, b.failures);
      cell(tr, b.reason);
      const td = cell(tr, "");
      [["Force open", "open"], ["Reset", "reset"]].forEach(([label, action]) => {
        const btn = document.createElement("button");
        btn.textContent = label; btn.className = "breaker-" + action; btn.dataset.needs = "operator";
        btn.addEventListener("click", async () => {
          const reason = window.prompt(`Why ${action === "open" ? "open" : "reset"} the breaker of ${b.system}?`);
          if (!reason) return;
          try { await api("POST", `/api/v1/breakers/${encodeURIComponent(b.system)}:${action}`, { reason }); showError(""); }
          catch (e) { showError(e.message); }
          loadBreakers();
        });
        td.appendChild(btn);
      });
      tbody.appendChild(tr);
    });
    noneRow(tbody);
  } catch (e) { showError(e.message); }
}

async function loadAudit() {
  const form = new FormData($("#audit-form"));
  const q = new URLSearchParams({ limit: "200" });
  for (const [k, v] of form.entries()) {
    if (v) q.set(k, k === "since" || k === "until" ? v + "Z" : v);
  }
  try {
    const rows = (await api("GET", "/api/v1/audit?" + q)).map((a) => ({ ...a, at: fmt(a.at),
      message_ids: a.message_ids.join(", ") }));
    noneRow(fillTable("#audit", rows, ["at", "who", "role", "action", "target", "message_ids", "old_value",
      "new_value", "client", "request_id"]));
    showError("");
  } catch (e) { showError(e.message); }
}

async function loadSettings() {
  try {
    const shown = await api("GET", "/api/v1/config");
    const rows = shown.process.settings.map((s) => ({ ...s, live: s.live ? "live" : "needs a restart" }));
    noneRow(fillTable("#settings", rows, ["name", "value", "source", "live"]));
    noneRow(fillTable("#settings-values", shown.values, ["name", "value", "set_by", "set_at", "reason"]));
    const select = $("#setting-name"), chosen = select.value;
    select.replaceChildren(...shown.process.settings.filter((s) => s.live).map((s) => new Option(s.name, s.name)));
    if (chosen) select.value = chosen;
    showError("");
  } catch (e) { showError(e.message); }
}

async function changeSetting(method) {
  const name = $("#setting-name").value, reason = $("#setting-reason").value || null;
  const body = method === "PUT" ? { value: $("#setting-value").value, reason } : { reason };
  try {
    await api(method, "/api/v1/config/" + encodeURIComponent(name), body);
    $("#setting-value").value = "";
    await loadSettings();
  } catch (e) { showError(e.message); }
}

function selectTab(name) {
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("active", b.dataset.tab === name));
  document.querySelectorAll(".tab").forEach((s) => { s.hidden = s.id !== "tab-" + name; });
  if (name === "overview") startOverview(); else stopOverview();
  if (name === "search" && !$("#results tbody").rows.length) search(false);
  if (name === "failed") loadFailed();
  if (name === "routes") { loadRoutes(); loadBreakers(); }
  if (name === "audit") loadAudit();
  if (name === "errors") loadErrors();
  if (name === "settings") loadSettings();
}

function logout() {
  sessionStorage.removeItem(TOKEN_KEY);
  stopOverview();
  delete document.body.dataset.role;
  $("#whoami").hidden = true;
  $("#main").hidden = true; $("#tabs").hidden = true; $("#logout").hidden = true; $("#login").hidden = false;
}

async function openMain() {
  try {
    const me = await api("GET", "/api/v1/whoami");
    document.body.dataset.role = me.role;  // hides the controls the role may not use (admin.css)
    $("#whoami").textContent = `${me.name} (${me.role})`;
    $("#whoami").hidden = false;
    await loadRouteSteps();
  } catch (e) { showError(e.message); return; }
  $("#login").hidden = true; $("#main").hidden = false; $("#tabs").hidden = false; $("#logout").hidden = false;
  selectTab("overview");  // what an operator asks first: is traffic flowing, what fails, what is stuck
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  $("#token").value = "";
  try {
    await api("GET", "/api/v1/routes");
    showError("");
    await openMain();
  } catch (e) { showError(e.message); }
});
$("#search-form").addEventListener("submit", (ev) => { ev.preventDefault(); search(false); });
$("#more").addEventListener("click", () => search(true));
$("#failed-refresh").addEventListener("click", loadFailed);
$("#routes-refresh").addEventListener("click", loadRoutes);
$("#errors-refresh").addEventListener("click", loadErrors);
$("#logout").addEventListener("click", logout);
document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => selectTab(b.dataset.tab)));
$("#d-refresh").addEventListener("click", () => showMessage(current));
$("#d-close").addEventListener("click", () => { $("#detail").hidden = true; current = null; clearTimeout(refreshTimer); });
$("#d-restart").addEventListener("click", () => act("restart", { total: false }));
$("#d-restart-total").addEventListener("click", () => act("restart", { total: true },
  "Total restart makes every external call of this message again. Continue?"));
$("#bulk-restart").addEventListener("click", () => bulk("restart"));
$("#bulk-cancel").addEventListener("click", () => bulk("cancel"));
$("#ov-resend-parked").addEventListener("click", () => resendConfirmations("/api/v1/confirmations:resend"));
$("#d-cancel").addEventListener("click", () => act("cancel", undefined, "Cancel this message?"));
$("#d-restart-from").addEventListener("click", () => act("restart", { from_step: $("#d-from-step").value },
  `Restart from step ${$("#d-from-step").value}: it and the later steps call their systems again. Continue?`));
$("#d-retry").addEventListener("click", () => act("retry"));
$("#d-resubmit").addEventListener("click", resubmit);
$("#audit-form").addEventListener("submit", (ev) => { ev.preventDefault(); loadAudit(); });
$("#settings-refresh").addEventListener("click", loadSettings);
$("#setting-form").addEventListener("submit", (ev) => { ev.preventDefault(); changeSetting("PUT"); });
$("#setting-unset").addEventListener("click", () => changeSetting("DELETE"));

if (token()) openMain();
