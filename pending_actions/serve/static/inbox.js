// The approval inbox: polls /v1/inbox (fetch can send the bearer token, EventSource cannot),
// renders the tenant's pending actions grouped by session, newest first, and resolves one with
// expect_id set to the id on screen, so a late click never approves something else.
"use strict";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
let token = tokenFromLink() || sessionStorage.getItem("pa-token") || "";
let lastBody = "";
let serverSkew = 0; // server clock minus ours, so ages are the server's
let pending = null; // {session, id, act, label} while the dialog is open
let timer = null;

// A sign-in link (`token create` prints INBOX_URL#token=TOKEN): a fragment never goes to a
// server. The token is kept in this tab's sessionStorage, as the form keeps a typed one, and
// taken out of the address before anything else runs, so that a bookmark, a copied address or
// the Back button of this tab never carries it.
function tokenFromLink() {
  const found = new URLSearchParams(location.hash.slice(1)).get("token");
  if (found === null) return "";
  history.replaceState(null, "", location.pathname + location.search);
  const given = found.trim();
  if (given) sessionStorage.setItem("pa-token", given);
  return given;
}

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
  if (!mayDecide) {
    // the server refuses a producer's resolve (403): offer no button it would refuse
    buttons.append(el("span", { class: "meta" }, "a producer's token may look, not decide: " +
      "sign in with an approver's token to approve or discard"));
    card.append(buttons);
    return card;
  }
  for (const [act, cls] of [["apply", "approve"], ["discard", "discard"]]) {
    const mine = a.approval && a.approval[act] && a.approval[act].mine;
    if (mine) {
      // a second click of the same person counts nothing (the server says so): no button
      // that offers it, but what the approval is waiting for
      buttons.append(el("span", { class: `meta mine ${cls}` }, mineText(a, act)));
      continue;
    }
    const b = el("button", { class: cls, type: "button", "data-act": act }, verbText(a, act));
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

const approvers = (n) => (n === 1 ? "approver" : "approvers");

// what its policy decided: the rule, and for an action that waits for people who approved,
// how far that is, and how many more it needs
function policyLine(a) {
  const p = a.policy;
  const rule = p.rule ? `rule ${p.rule}` : "the policy's default";
  const line = el("div", { class: "meta policy" }, `${p.decision}${p.auto ? " (auto)" : ""} by ${rule}`);
  if (a.approval) line.append(el("span", { class: "badge approvals" }, approvalText(a)));
  if (a.revision) line.append(el("span", { class: "meta" }, ` · edited (revision ${a.revision})`));
  return line;
}

// "Approved by alice (1 of 2); waiting for 1 more approver", of the verb the approvals are of
function approvalText(a) {
  const { needed } = a.approval;
  const [verb, v] = approvalsGiven(a);
  if (!v.by.length) return `Waiting for ${needed} ${approvers(needed)} (0 of ${needed})`;
  const what = verb === "discard" ? "Discard approved" : "Approved";
  return `${what} by ${v.by.join(", ")} (${v.by.length} of ${needed}); ` +
    `waiting for ${v.missing} more ${approvers(v.missing)}`;
}

// the verb people's approvals are of (one at a time), and where they stand
function approvalsGiven(a) {
  const d = a.approval.discard;
  return d && d.by.length ? ["discard", d] : ["apply", a.approval.apply];
}

// what a click does: a person's approval that is not the last only adds one, and says so
function verbText(a, act) {
  const v = a.approval && a.approval[act];
  if (!v) return act === "apply" ? "Approve" : "Discard";
  const k = a.approval.needed - v.missing + 1;
  if (v.missing > 1) return act === "apply" ? `Add approval (${k} of ${a.approval.needed})`
    : `Add discard approval (${k} of ${a.approval.needed})`;
  return act === "apply" ? "Approve and apply" : "Approve and discard";
}

// in place of the button of a verb this person approved already
function mineText(a, act) {
  const v = a.approval[act];
  const then = act === "apply" ? "applies" : "is discarded";
  return `You approved this${act === "discard" ? " discard" : ""}; it ${then} once ` +
    `${v.missing} more ${approvers(v.missing)} ${v.missing === 1 ? "approves" : "approve"}`;
}

// the approvals a click of act would set aside: people approve one verb at a time
function setAside(a, act) {
  if (!a.approval) return "";
  const [verb, v] = approvalsGiven(a);
  if (verb === act || !v.by.length || !a.approval[act]) return "";
  return `This sets aside the approvals to ${verb} (${v.by.join(", ")}): approvals count ` +
    "for one of apply and discard at a time.";
}

// producer tokens read the inbox too; only approvers and admins resolve
let mayDecide = true;

function render(data) {
  mayDecide = data.role !== "producer";
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
      a.approval, a.revision]));
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
  $("decide-note").textContent = setAside(a, act);
  $("reason").value = "";
  // an approval may edit the payload: the person sees it as JSON and changes it
  $("edit-box").hidden = act !== "apply";
  $("edit-box").open = false;
  $("edit").value = JSON.stringify(pending.payload, null, 2);
  $("edit-error").textContent = "";
  // an edit starts the approvals again (people approve what they saw): say whose it drops
  const given = a.approval && act === "apply" ? a.approval.apply.by : [];
  $("edit-note").textContent = given.length ? `An edit sets aside the approvals given so far ` +
    `(${given.join(", ")}): yours is the first approval of the edited payload.` : "";
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
// a link opened in a tab that shows the page already only changes the fragment: no reload
window.addEventListener("hashchange", () => {
  const given = tokenFromLink();
  if (given) { token = given; lastBody = ""; poll(); }
});
$("decide-form").addEventListener("submit", decide);
$("cancel").addEventListener("click", () => { pending = null; $("decide").close(); });
$("edit").addEventListener("input", () => { $("edit-error").textContent = ""; });
setInterval(tick, 1000);
if (token) poll(); else showLogin("");
