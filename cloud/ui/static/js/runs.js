// The runs page: every run with its state and controls, refreshed every 2 s, and a form to create one.
import { parse as parseToml } from "../vendor/smol-toml/index.js";
import { ApiError, api, control, controls, element, percent, when, withToken } from "./api.js";

const REFRESH_MS = 2000;
let timer = null;

function row(info) {
  const b = info.config.topology.buffer_size;
  return element("tr", { "data-run": info.run_id, "data-status": info.status },
    element("td", {}, element("a", { href: `run.html?id=${encodeURIComponent(info.run_id)}` }, info.run_id)),
    element("td", {}, info.config.name),
    element("td", {}, info.config.algorithm),
    element("td", {}, element("span", { class: `status ${info.status}` }, info.status)),
    element("td", { class: "num" }, `${info.version} / ${info.rounds}`),
    element("td", { class: "num" }, percent(info.last_round?.test_accuracy)),
    element("td", { class: "num" }, `${info.buffered} / ${b}`),
    element("td", {}, when(info.created_at)),
    element("td", {}, controls(info, afterAction)),
  );
}

function afterAction(_info, error) {
  document.getElementById("runs-error").textContent = error ? error.message : "";
  refresh();
}

// While the list holds the same runs in the same order its rows are updated in place, and a row keeps its buttons
// while its status holds: a redraw between a click's press and its release would take the button away and lose the
// click.
function show(runs) {
  const tbody = document.querySelector("#runs tbody");
  const rows = [...tbody.children];
  if (rows.length !== runs.length || rows.some((tr, i) => tr.dataset.run !== runs[i].run_id)) {
    tbody.replaceChildren(...runs.map(row));
    return;
  }
  runs.forEach((info, i) => {
    const fresh = row(info);
    if (rows[i].dataset.status !== info.status) {
      rows[i].replaceWith(fresh);
      return;
    }
    const cells = [...fresh.children];
    [...rows[i].children].slice(0, -1).forEach((cell, j) => cell.replaceWith(cells[j]));  // all but the buttons
  });
}

async function refresh() {
  clearTimeout(timer);
  try {
    const runs = (await api("/api/v1/runs")).reverse();  // newest first
    show(runs);
    document.getElementById("no-runs").hidden = runs.length > 0;
  } catch (error) {
    document.getElementById("runs-error").textContent = `could not list runs: ${error.message}`;
    if (error instanceof ApiError && error.status === 401) return;  // the token form is showing
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

// JSON if it looks like JSON, else TOML; the cloud validates either the same way.
function readConfig(text) {
  const trimmed = text.trim();
  if (trimmed.startsWith("{")) {
    try { return JSON.parse(trimmed); } catch (error) { throw new Error(`not valid JSON: ${error.message}`); }
  }
  try { return parseToml(trimmed); } catch (error) { throw new Error(`not valid TOML: ${error.message}`); }
}

// The API's 422 detail as it gives it: one line per error, where (loc) and what (msg).
function showErrors(errors) {
  const list = document.getElementById("create-errors");
  list.replaceChildren(...errors.map((e) => element("li", {},
    typeof e === "string" ? e : `${(e.loc ?? []).join(".")}: ${e.msg}`)));
}

async function create(event) {
  event.preventDefault();
  const form = event.target;
  showErrors([]);
  let config;
  try { config = readConfig(form.elements.config.value); } catch (error) { return showErrors([error.message]); }
  try {
    const info = await api("/api/v1/runs", { method: "POST", json: config });
    if (form.elements.start.checked) await control(info.run_id, "start");
  } catch (error) {
    showErrors(Array.isArray(error.detail) ? error.detail : [error.message]);
  }
  refresh();
}

async function loadFile(event) {
  const file = event.target.files[0];
  if (file) document.querySelector("#create textarea").value = await file.text();
}

withToken(() => {
  document.getElementById("app").hidden = false;
  document.getElementById("create").addEventListener("submit", create);
  document.querySelector("#create input[type=file]").addEventListener("change", loadFile);
  refresh();
});
