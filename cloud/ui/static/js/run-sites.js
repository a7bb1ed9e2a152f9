// The run page's sites and devices: which sites and devices the run uses in its current round (polled from the
// site registry every 2 s), which devices failed a round and why (from the history run.js receives), and the
// run's status line saying so when every device of its current round failed. The DVFS chart shows for DVFS runs.
import { ApiError, api, element, runPath, when } from "./api.js";

const REFRESH_MS = 2000;
const runId = new URLSearchParams(location.search).get("id");
const failedRounds = new Map();  // version -> {round, failed_clients}: a round sent again replaces itself
let siteNames = new Map();  // edge id -> site name
let timer = null;
let ended = false;  // a finished or stopped run's sites no longer change: read once more, then stop

function verdictBadge() {
  let badge = document.getElementById("devices-verdict");
  if (!badge) {
    badge = element("span", { id: "devices-verdict", class: "status failed", hidden: "" });
    document.getElementById("status").after(" ", badge);
  }
  return badge;
}

function drawFailures() {
  const devices = new Map();  // "edge:client" -> {client, edge, rounds, last, kind, error}
  for (const { round, failed } of [...failedRounds.values()].sort((a, b) => a.round - b.round)) {
    for (const f of failed) {
      const key = `${f.edge_id}:${f.client_id}`;
      const seen = devices.get(key) ?? { client: f.client_id, edge: f.edge_id, rounds: 0 };
      devices.set(key, { ...seen, rounds: seen.rounds + 1, last: round, kind: f.kind, error: f.error });
    }
  }
  const rows = [...devices.values()].sort((a, b) => a.edge - b.edge || a.client - b.client);
  document.getElementById("no-failures").hidden = rows.length > 0;
  document.getElementById("failed-devices").hidden = rows.length === 0;
  document.querySelector("#failed-devices tbody").replaceChildren(...rows.map((d) => element("tr",
    { "data-device": d.client, "data-edge": d.edge },
    element("td", { class: "num" }, String(d.client)),
    element("td", {}, siteNames.get(d.edge) ?? `edge ${d.edge}`),
    element("td", { class: "num" }, String(d.rounds)),
    element("td", { class: "num" }, String(d.last)),
    element("td", {}, d.kind),
    element("td", { class: "reason" }, d.error))));
}

function drawSites(run) {
  siteNames = new Map(run.sites.filter((s) => s.name).map((s) => [s.edge_id, s.name]));
  document.querySelector("#run-sites tbody").replaceChildren(...run.sites.map((s) => element("tr",
    { "data-edge": s.edge_id, "data-site": s.name ?? "" },
    element("td", {}, s.name ?? "– (not registered)"),
    element("td", { class: "num" }, String(s.edge_id)),
    element("td", {}, s.status ? element("span", { class: `status ${s.status}` }, s.status) : "–"),
    element("td", { class: "num" }, String(s.tasks)),
    element("td", { class: "num" }, String(s.answered)),
    element("td", { class: "num" }, String(s.failed)),
    element("td", { class: "reason" }, s.devices.map((d) => d.failed_run === run.run_id
      ? `${d.client_id} failed (${d.failure}, last seen ${when(d.last_seen)})`
      : `${d.client_id} ${d.state}`).join("; ") || "–"))));
  const badge = verdictBadge();
  badge.hidden = !run.all_failed;
  badge.textContent = "every device failed";
  document.getElementById("sites-verdict").textContent = run.all_failed
    ? `Every device given a task of the current round reported it could not train it: ${run.reasons.join("; ")}`
    : "";
  drawOutliers(run);
  drawFailures();
}

// Devices whose claimed sample count stands far above the median of the last recorded round: no one can check
// a device's own data, so the claim is only bounded (max_samples_per_device) and shown.
function drawOutliers(run) {
  const line = document.getElementById("sample-outliers");
  line.hidden = run.sample_outliers.length === 0;
  line.textContent = line.hidden ? "" : `Sample-count outliers in round ${run.outliers_round}: ` + run.sample_outliers
    .map((o) => `device ${o.client_id} at ${siteNames.get(o.edge_id) ?? `edge ${o.edge_id}`} claims ${o.num_samples} `
      + `samples (the round's median: ${o.median})`).join("; ");
}

async function refresh() {
  clearTimeout(timer);
  try {
    drawSites(await api(runPath(runId, "/sites")));
  } catch (error) {
    if (error instanceof ApiError && [401, 404].includes(error.status)) return;  // run.js says why
  }
  if (!ended) timer = setTimeout(refresh, REFRESH_MS);
}

document.addEventListener("run-update", ({ detail: update }) => {
  for (const h of update.rounds) failedRounds.set(h.version, { round: h.round, failed: h.failed_clients });
  ended = ["finished", "stopped"].includes(update.info.status);
  drawFailures();
  if (timer === null || ended) refresh();
});
