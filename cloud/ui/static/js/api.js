// The admin API as the pages use it: the token entered once (kept in this tab's sessionStorage and sent
// as the same bearer header the API takes, never in a URL), JSON calls, live streams and downloads.
const KEY = "fl-admin-token";

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.detail = detail;
  }
}

const token = () => sessionStorage.getItem(KEY);
const auth = () => ({ Authorization: `Bearer ${token()}` });

async function failure(response) {
  const text = await response.text();
  let detail = text;
  try { detail = JSON.parse(text).detail ?? text; } catch { /* not JSON: the text says it */ }
  if (response.status === 401) showLogin("The cloud refused the token: enter it again.");
  return new ApiError(response.status, detail);
}

export async function api(path, { method = "GET", json } = {}) {
  const headers = { ...auth(), ...(json === undefined ? {} : { "Content-Type": "application/json" }) };
  const response = await fetch(path, { method, headers, body: json === undefined ? undefined : JSON.stringify(json) });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export const control = (runId, action) => api(`/api/v1/runs/${runId}/${action}`, { method: "POST" });

// Deletes a run that is not active (the cloud answers 409 for a running or paused one, 204 with no body).
export async function remove(runId) {
  const response = await fetch(`/api/v1/runs/${runId}`, { method: "DELETE", headers: auth() });
  if (!response.ok) throw await failure(response);
}

// The model as safetensors: fetched with the header (a plain link could not send it), saved from a blob.
export async function downloadModel(runId) {
  const response = await fetch(`/api/v1/runs/${runId}/model`, { headers: auth() });
  if (!response.ok) throw await failure(response);
  const version = response.headers.get("X-FL-Version");
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = `model-${runId}-v${version}.safetensors`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
}

// A server-sent event stream read with fetch (EventSource cannot send the Authorization header).
// Calls onEvent(name, data) per event; returns when the server ends the stream.
export async function follow(path, onEvent, signal) {
  const response = await fetch(path, { headers: { ...auth(), Accept: "text/event-stream" }, signal });
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue; // a keepalive comment
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") name = text;
        else if (field === "data") data.push(text);
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

// ---- the token --------------------------------------------------------------------------------------
let onReady = null;

function showLogin(message = "") {
  sessionStorage.removeItem(KEY);
  document.getElementById("login").hidden = false;
  document.getElementById("signed-in").hidden = true;
  document.getElementById("login-error").textContent = message;
}

// The bar on top of every page: where to go, and the token (its form, or "forget").
function header() {
  const bar = document.getElementById("top");
  bar.innerHTML = `
    <a class="brand" href="/ui/">FL cloud</a>
    <nav><a href="/ui/">Runs</a> <a href="/ui/topology.html">Topology</a> <a href="/docs">API docs</a>
      <a href="/redoc">ReDoc</a></nav>
    <form id="login" hidden>
      <label>Admin token <input name="token" type="password" autocomplete="current-password" required></label>
      <button type="submit">Use</button> <span id="login-error" class="error" role="alert"></span>
      <p id="login-hint" class="hint">The cloud's admin token: what it was started with as
        <code>FL_CLOUD_ADMIN_TOKEN</code> (or <code>admin_token</code> in its <code>FL_CLOUD_CONFIG_FILE</code>, or
        one of <code>FL_CLOUD_ADMIN_TOKENS</code>). <code>fedctl up</code> keeps it in its <code>tokens.env</code>
        as <code>FL_ADMIN_TOKEN</code>; <code>fedctl demo</code> prints it; a local development cloud started
        without one takes <code>dev-admin-token</code>. It stays in this tab only.</p>
    </form>
    <span id="signed-in" hidden>token set <button type="button" id="forget">forget</button></span>`;
}

// Runs start() once a token the cloud accepts is known: at once if this tab has one, else after the form.
export function withToken(start) {
  header();
  onReady = start;
  const form = document.getElementById("login");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const given = form.elements.token.value.trim();
    if (!given) return;
    // Checked before it is kept: a wrong token is said so here, not by every later call.
    const response = await fetch("/api/v1/runs", { headers: { Authorization: `Bearer ${given}` } });
    if (response.status === 401) {
      document.getElementById("login-error").textContent = "The cloud refused this token.";
      return;
    }
    sessionStorage.setItem(KEY, given);
    form.reset();
    ready();
  });
  document.getElementById("forget").addEventListener("click", () => {
    showLogin();
    location.reload();
  });
  if (token()) ready();
  else showLogin();
}

function ready() {
  document.getElementById("login").hidden = true;
  document.getElementById("signed-in").hidden = false;
  const start = onReady;
  onReady = null;
  if (start) start();
  else location.reload();  // signed in again after a refusal: the page's loops had stopped
}

// ---- formatting shared by both pages -----------------------------------------------------------------
export const percent = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(2)}%`);
export const fixed = (x, digits = 4) => (x === null || x === undefined ? "–" : x.toFixed(digits));
export const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");

export function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// What each status allows, as the cloud's transitions say (cloud/store.py); delete: what is not active.
const ACTIONS = { created: ["start", "stop"], running: ["pause", "stop"], paused: ["resume", "stop"] };
const DELETABLE = ["created", "stopped", "finished"];

// Start/pause/resume/stop buttons for a run, and its model download; after(info|error) is called after each.
export function controls(info, after) {
  const box = element("span", { class: "controls" });
  for (const action of ACTIONS[info.status] ?? []) {
    box.append(element("button", {
      type: "button", class: `action ${action}`, "data-action": action,
      onclick: async () => {
        try { after(await control(info.run_id, action)); } catch (error) { after(null, error); }
      },
    }, action));
  }
  box.append(element("button", {
    type: "button", class: "action download", "data-action": "download",
    onclick: async () => {
      try { await downloadModel(info.run_id); } catch (error) { after(null, error); }
    },
  }, "model ⤓"));
  if (DELETABLE.includes(info.status)) {
    box.append(element("button", {
      type: "button", class: "action delete", "data-action": "delete",
      onclick: async () => {
        if (!confirm(`Delete run ${info.run_id} (${info.config.name}) with its model and history? This cannot be undone.`)) return;
        try {
          await remove(info.run_id);
          // Its own page has nothing left to show: back to the list.
          if (location.pathname.endsWith("/run.html")) location.assign("/ui/");
          else after(null);
        } catch (error) { after(null, error); }
      },
    }, "delete"));
  }
  return box;
}
