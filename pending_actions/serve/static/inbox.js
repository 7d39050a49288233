// The approval inbox: polls /v1/inbox (fetch can send the bearer token, EventSource cannot),
// renders the tenant's pending actions grouped by session, newest first, and resolves one with
// expect_id set to the id on screen, so a late click never approves something else.
"use strict";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("pa-token") || "";
let lastBody = "";
let serverSkew = 0; // server clock minus ours, so ages are the server's
let pending = null; // {session, id, act, label} while the dialog is open
let timer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c); // strings become text nodes: never HTML
  return node;
}

function duration(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function isDiff(text) {
  return typeof text === "string" && /^@@ .* @@/m.test(text) && /^(---|\+\+\+) /m.test(text);
}

function diffBlock(text) {
  const pre = el("pre", { class: "diff" });
  for (const line of text.split("\n")) {
    let cls = "";
    if (line.startsWith("+++") || line.startsWith("---")) cls = "file";
    else if (line.startsWith("@@")) cls = "hunk";
    else if (line.startsWith("+")) cls = "add";
    else if (line.startsWith("-")) cls = "del";
    pre.append(cls ? el("span", { class: cls }, line) : line + "\n");
  }
  return pre;
}

function preview(payload) {
  const out = [];
  const rest = {};
  for (const [k, v] of Object.entries(payload || {})) {
    if (isDiff(v)) out.push(el("div", { class: "meta" }, k), diffBlock(v));
    else rest[k] = v;
  }
  if (Object.keys(rest).length) out.unshift(el("pre", { class: "payload" }, JSON.stringify(rest, null, 2)));
  return out;
}

function ageLine(a) {
  const now = Date.now() / 1000 + serverSkew;
  const span = el("span", { class: "meta age", "data-created": String(a.created_at) },
    `staged ${duration(now - a.created_at)} ago`);
  const parts = [span];
  if (a.expires_at) {
    parts.push(el("span", { class: "badge expiry", "data-expires": String(a.expires_at) },
      `expires in ${duration(a.expires_at - now)}`));
  }
  return parts;
}

function actionCard(a) {
  const card = el("div", { class: "action", "data-id": a.id, "data-session": a.session });
  const top = el("div", { class: "top" }, el("span", { class: "label" }, a.label),
    el("span", { class: "badge" }, a.tool), el("span", { class: "meta" }, a.id), ...ageLine(a));
  if (a.state === "in_flight") top.append(el("span", { class: "badge flight" }, "running"));
  if (a.attempts) top.append(el("span", { class: "meta" }, `attempts: ${a.attempts}`));
  card.append(top);
  const policy = a.policy;
  if (policy) card.append(policyLine(a));
  if (a.last_error) card.append(el("div", { class: "error" }, `last error: ${a.last_error}`));
  card.append(...preview(a.payload));
  const buttons = el("div", { class: "buttons" });
  for (const [act, text, cls] of [["apply", approveText(a), "approve"], ["discard", "Discard", "discard"]]) {
    const b = el("button", { class: cls, type: "button", "data-act": act }, text);
    b.disabled = !a.target;
    b.addEventListener("click", () => ask(a, act));
    buttons.append(b);
  }
  if (!a.target && a.state !== "in_flight") {
    buttons.append(el("span", { class: "meta" }, "a newer action of this session comes first"));
  }
  card.append(buttons);
  return card;
}

// what its policy decided: the rule, and for an action that waits for people how many
// approvals it has and needs, and whose
function policyLine(a) {
  const p = a.policy;
  const rule = p.rule ? `rule ${p.rule}` : "the policy's default";
  const line = el("div", { class: "meta policy" }, `${p.decision}${p.auto ? " (auto)" : ""} by ${rule}`);
  if (p.decision === "ask") {
    const names = a.approved_by || [];
    line.append(el("span", { class: "badge approvals" },
      `${names.length} of ${p.approvals} approvals${names.length ? ": " + names.join(", ") : ""}`));
  }
  if (a.revision) line.append(el("span", { class: "meta" }, ` · edited (revision ${a.revision})`));
  return line;
}

// an approve that would only add an approval says so
function approveText(a) {
  const p = a.policy;
  if (!p || p.decision !== "ask") return "Approve";
  const have = (a.approved_by || []).length;
  if (have + 1 < p.approvals) return `Add approval (${have + 1} of ${p.approvals})`;
  return "Approve and apply";
}

function render(data) {
  const groups = new Map(); // insertion order: sessions by their newest action
  for (const a of data.actions) {
    if (!groups.has(a.session)) groups.set(a.session, []);
    groups.get(a.session).push(a);
  }
  const root = $("sessions");
  root.replaceChildren(...[...groups].map(([session, actions]) =>
    el("section", { class: "session", "data-session": session },
      el("h2", {}, `session ${session} · ${actions.length} pending`), ...actions.map(actionCard))));
  $("empty").hidden = data.actions.length > 0;
}

function tick() {
  const now = Date.now() / 1000 + serverSkew;
  for (const s of document.querySelectorAll(".age")) {
    s.textContent = `staged ${duration(now - Number(s.dataset.created))} ago`;
  }
  for (const s of document.querySelectorAll("[data-expires]")) {
    s.textContent = `expires in ${duration(Number(s.dataset.expires) - now)}`;
  }
}

async function api(path, options) {
  const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
  return fetch(path, { ...(options || {}), headers });
}

function showLogin(message) {
  token = "";
  sessionStorage.removeItem("pa-token");
  $("login").hidden = false;
  $("signout").hidden = true;
  $("login-error").textContent = message || "";
  $("sessions").replaceChildren();
  $("live").classList.remove("on");
  $("who").textContent = "";
  lastBody = "";
}

async function poll() {
  clearTimeout(timer);
  if (!token) return;
  try {
    const r = await api("/v1/inbox");
    if (r.status === 401 || r.status === 403) {
      const body = await r.json().catch(() => ({}));
      showLogin(body.error || `refused (${r.status})`);
      return;
    }
    const text = await r.text();
    const data = JSON.parse(text);
    serverSkew = data.now - Date.now() / 1000;
    $("who").textContent = `${data.token} · tenant ${data.tenant} · ${data.role}`;
    $("live").classList.add("on");
    $("login").hidden = true;
    $("signout").hidden = false;
    const shape = JSON.stringify(data.actions.map((a) => [a.id, a.state, a.target, a.attempts, a.last_error,
      a.approved_by, a.revision]));
    if (shape !== lastBody) { lastBody = shape; render(data); }
  } catch (e) {
    $("live").classList.remove("on");
  }
  timer = setTimeout(poll, POLL_MS);
}

function ask(a, act) {
  pending = { session: a.session, id: a.id, act, label: a.label, revision: a.revision || 0,
    payload: a.payload || {} };
  $("decide-title").textContent = act === "apply" ? "Approve" : "Discard";
  $("decide-label").textContent = `${a.label} (${a.id})`;
  $("reason").value = "";
  // an approval may edit the payload: the person sees it as JSON and changes it
  $("edit-box").hidden = act !== "apply";
  $("edit-box").open = false;
  $("edit").value = JSON.stringify(pending.payload, null, 2);
  $("edit-error").textContent = "";
  $("decide").showModal();
  $("reason").focus();
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

// the JSON Merge Patch (RFC 7386) that turns `from` into `to`: null where a key went
function mergePatch(from, to) {
  const patch = {};
  for (const k of Object.keys(from)) if (!(k in to)) patch[k] = null;
  for (const [k, v] of Object.entries(to)) {
    if (isObject(v) && isObject(from[k])) {
      const inner = mergePatch(from[k], v);
      if (Object.keys(inner).length) patch[k] = inner;
    } else if (JSON.stringify(v) !== JSON.stringify(from[k])) {
      patch[k] = v;
    }
  }
  return patch;
}

// the edit the box holds (undefined: none), or a message saying why it cannot be sent
function editOf(payload) {
  let edited;
  try {
    edited = JSON.parse($("edit").value);
  } catch (e) {
    return { error: `the payload is not JSON: ${e.message}` };
  }
  if (!isObject(edited)) return { error: "the payload must be a JSON object" };
  const patch = mergePatch(payload, edited);
  return { edit: Object.keys(patch).length ? patch : undefined };
}

async function decide(event) {
  event.preventDefault();
  const reason = $("reason").value.trim();
  if (!reason || !pending) return;
  const { session, id, act, label, revision, payload } = pending;
  const body = { action: act, reason, expect_id: id, revision };
  if (act === "apply") {
    const { edit, error } = editOf(payload);
    if (error) { $("edit-box").open = true; $("edit-error").textContent = error; return; }
    if (edit) body.edit = edit;
  }
  pending = null;
  $("decide").close();
  $("notice").textContent = `${act === "apply" ? "Approving" : "Discarding"} ${label}…`;
  const r = await api(`/v1/sessions/${encodeURIComponent(session)}/resolve`,
    { method: "POST", body: JSON.stringify(body) });
  const got = await r.json().catch(() => ({}));
  const failed = got.is_error || !r.ok;
  $("notice").className = failed ? "error" : "";
  $("notice").textContent = noticeText(label, got, failed ? undefined : body.edit);
  poll();
}

// what a decision came to: the result's text, led by the action's label unless the text names
// it already (the service's own texts and many handlers' do: "Applied: <label>. Reason: ..."),
// then whether the person's edit went in (an apply's result carries it as details.edit; an
// approval that is not the last one keeps the edited payload for the approvals to come)
function noticeText(label, got, edit) {
  const text = got.content ? got.content.map((c) => c.text).join(" ") : got.error;
  const named = text && text.includes(label) ? text : `${label}: ${text}`;
  if (!edit) return named;
  const details = got.details || {};
  return details.edit ? `${named} (applied with your edit of the payload)`
    : `${named} (your edit of the payload is kept for the approvals to come)`;
}

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("pa-token", token);
  poll();
});
$("signout").addEventListener("click", () => showLogin(""));
$("decide-form").addEventListener("submit", decide);
$("cancel").addEventListener("click", () => { pending = null; $("decide").close(); });
$("edit").addEventListener("input", () => { $("edit-error").textContent = ""; });
setInterval(tick, 1000);
if (token) poll(); else showLogin("");
