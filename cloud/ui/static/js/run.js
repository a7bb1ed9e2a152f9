// One run, live: its state, accuracy and loss curves, edges against the buffer, history and clients.
// Everything arrives on the run's event stream; the page never reloads.
import { ApiError, controls, element, fixed, follow, percent, runPath, when, withToken } from "./api.js";

const runId = new URLSearchParams(location.search).get("id");
const history = [];
let selected = null;  // the round whose clients are shown (null: the latest)
let charts = null;

function chart(id, series, yLabel) {
  const target = document.getElementById(id);
  const width = () => Math.max(300, target.clientWidth);
  const plot = new uPlot({
    width: width(), height: 260,
    scales: { x: { time: false } },
    // Rounds are whole numbers, counted from 0 as in the history's round field (the CSV and fedctl too): no
    // tick at 1.5.
    axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, { label: yLabel }],
    series: [{ label: "round" }, ...series.map(([label, stroke]) => ({ label, stroke, width: 2, points: { size: 5 } }))],
  }, [[], ...series.map(() => [])], target);
  new ResizeObserver(() => plot.setSize({ width: width(), height: 260 })).observe(target);
  return plot;
}

// The modelled client energy (DVFS) summed over the history up to each round; null where a round has none (a run
// that models no device: not measured).
function cumulativeEnergy() {
  let total = 0;
  return history.map((h) => (h.energy_j === null || h.energy_j === undefined ? null : (total += h.energy_j)));
}

function drawCharts() {
  const x = history.map((h) => h.round);
  charts.accuracy.setData([x, history.map((h) => (h.test_accuracy === null ? null : 100 * h.test_accuracy)),
    history.map((h) => (federated(h) === null ? null : 100 * federated(h).accuracy))]);
  charts.loss.setData([x, history.map((h) => h.train_loss), history.map((h) => h.test_loss)]);
  const cumulative = cumulativeEnergy();
  charts.energy.setData([x, history.map((h) => h.energy_j ?? null), cumulative]);
  document.getElementById("energy-total").textContent = joules(cumulative.at(-1));
  // The chart is about DVFS: shown once the run's rounds carry modelled energy.
  document.getElementById("energy-chart").closest("figure").hidden = !cumulative.some((e) => e !== null);
  document.getElementById("energy-chart").dataset.points = String(history.length);
  // What the browser test counts: points drawn on the accuracy chart.
  document.getElementById("accuracy-chart").dataset.points = String(history.length);
}

// The devices' evaluation (RunConfig.evaluation "federated", "both") of the newest version the round's
// contributions were computed on; null where none was made.
const federated = (h) => h.federated?.at(-1) ?? null;

// Per site, what its devices evaluated: the cell's tooltip.
const siteFigures = (h) => (h.federated ?? []).flatMap((f) => f.sites.map((s) =>
  `version ${f.version}, edge ${s.edge_id}: ${percent(s.accuracy)} of ${s.num_samples} samples`)).join("\n");

const EVALUATION = { cloud: "cloud test set", federated: "devices' held-out splits", both: "cloud test set and devices' held-out splits" };

function maxStaleness(h) {
  return h.contributions.length ? Math.max(...h.contributions.map((c) => c.staleness)) : 0;
}

const joules = (x) => (x === null || x === undefined ? "–" : `${fixed(x, 1)} J`);

// What a client's device did under the DVFS model (null from results made outside a client process).
function deviceCells(d) {
  if (!d) return ["–", "–", "–", "–"].map((t) => element("td", {}, t));
  return [element("td", {}, `${d.profile} (${d.policy}, ${d.backend})`),
    element("td", {}, d.frequencies_ghz.map((f) => f.toFixed(2)).join(" ")),
    element("td", { class: "num" }, `${fixed(d.compute_s + d.comm_s, 2)} s`),
    element("td", { class: "num" }, joules(d.energy_j))];
}

function drawHistory() {
  const cumulative = cumulativeEnergy();
  const rows = history.slice().reverse().map((h, i) => element("tr", {
    "data-version": h.version, class: h.version === (selected ?? history.at(-1)?.version) ? "selected" : "",
    onclick: () => { selected = h.version; drawHistory(); },
  },
    element("td", { class: "num" }, String(h.round)), element("td", { class: "num" }, String(h.version)),
    element("td", {}, h.edges.join(", ")), element("td", { class: "num" }, String(h.clients.length)),
    element("td", { class: "num" }, String(maxStaleness(h))), element("td", { class: "num" }, fixed(h.train_loss)),
    element("td", { class: "num" }, fixed(h.test_loss)), element("td", { class: "num" }, percent(h.test_accuracy)),
    element("td", { class: "num" }, `${fixed(h.elapsed_s, 1)} s`),
    element("td", { class: "num" }, joules(h.energy_j)),
    element("td", { class: "num" }, joules(cumulative[history.length - 1 - i])),
    element("td", { class: "num federated", title: siteFigures(h) }, percent(federated(h)?.accuracy))));
  document.querySelector("#history tbody").replaceChildren(...rows);
  const round = history.find((h) => h.version === selected) ?? history.at(-1);
  document.getElementById("clients-round").textContent = round ? `${round.round} → version ${round.version}` : "–";
  document.querySelector("#clients tbody").replaceChildren(...(round?.clients ?? []).map((c) => element("tr", {},
    element("td", { class: "num" }, String(c.client_id)), element("td", { class: "num" }, String(c.edge_id)),
    element("td", { class: "num" }, String(c.num_samples)), element("td", { class: "num" }, fixed(c.loss)),
    element("td", {}, Object.entries(c.metrics).map(([k, v]) => `${k} ${fixed(v)}`).join(", ") || "–"),
    ...deviceCells(c.device))));
}

function drawEdges(edges) {
  document.getElementById("buffer").textContent = `${edges.buffered} / B = ${edges.buffer_size}`;
  const meter = document.getElementById("buffer-meter");
  meter.max = edges.buffer_size;
  meter.value = edges.buffered;
  document.querySelector("#edges tbody").replaceChildren(...edges.edges.map((e) => element("tr", { "data-edge": e.edge_id },
    element("td", { class: "num" }, String(e.edge_id)),
    element("td", {}, e.registered ? "yes" : "no"),
    element("td", {}, e.waiting ? element("span", { class: "status paused" }, "waiting") : "–"),
    element("td", { class: "num" }, e.base_version ?? "–"),
    element("td", { class: "num" }, e.staleness ?? "–"),
    element("td", {}, e.waiting ? `received ${when(e.received_at)}`
      : e.consumed_in !== null ? `consumed into version ${e.consumed_in}` : "none yet"),
    element("td", { class: "num" }, String(e.consumed)))));
}

function drawGroups(groups) {
  const names = [...new Set(Object.values(groups).flatMap((metrics) => Object.keys(metrics)))].sort();
  document.getElementById("groups-section").hidden = names.length === 0;
  document.querySelector("#groups thead").replaceChildren(element("tr", {},
    element("th", {}, "family"), ...names.map((n) => element("th", {}, n))));
  document.querySelector("#groups tbody").replaceChildren(...Object.entries(groups).map(([group, metrics]) =>
    element("tr", {}, element("td", {}, group), ...names.map((n) => element("td", { class: "num" },
      metrics[n] ? `${percentOrFixed(n, metrics[n][0])} ± ${percentOrFixed(n, metrics[n][1])}` : "–")))));
}

const percentOrFixed = (name, value) => (name.includes("accuracy") ? percent(value) : fixed(value));

let controlsFor = null;  // the status the shown buttons are for

function drawInfo(info) {
  document.title = `FL cloud · run ${info.run_id}`;
  document.getElementById("run-id").textContent = info.run_id;
  document.getElementById("run-name").textContent = info.config.name;
  const status = document.getElementById("status");
  status.textContent = info.status;
  status.className = `status ${info.status}`;
  document.getElementById("status-reason").textContent = info.reason ?? "";  // what a waiting run waits for, or why a run stopped short
  document.getElementById("algorithm").textContent = info.config.algorithm;
  document.getElementById("version").textContent = `${info.version} / ${info.rounds}`;
  document.getElementById("accuracy").textContent = percent(info.last_round?.test_accuracy);
  document.getElementById("evaluation").textContent = EVALUATION[info.config.evaluation] ?? info.config.evaluation;
  document.getElementById("federated-accuracy").textContent =
    percent(info.last_round ? federated(info.last_round)?.accuracy : null);
  document.getElementById("started").textContent = when(info.started_at);
  // The buttons are rebuilt only when the status changes what they offer: a redraw between a click's press and its
  // release (a fast run streams several updates a second) would take the button away and lose the click.
  if (info.status === controlsFor) return;
  controlsFor = info.status;
  document.getElementById("controls").replaceChildren(controls(info, (changed, error) => {
    document.getElementById("run-error").textContent = error ? error.message : "";
    if (changed) drawInfo(changed);  // the stream confirms it a moment later
  }));
}

function onUpdate(update, fresh) {
  if (fresh) history.length = 0;  // a new connection starts with the whole history again
  for (const round of update.rounds) {  // a round sent again has its evaluation filled in
    const at = history.findIndex((h) => h.version === round.version);
    if (at >= 0) history[at] = round;
    else history.push(round);
  }
  drawInfo(update.info);
  drawEdges(update.edges);
  drawGroups(update.groups);
  drawCharts();
  drawHistory();
  document.dispatchEvent(new CustomEvent("run-update", { detail: update }));  // js/run-sites.js follows it too
}

// Follows the run's stream, reconnecting after a drop, until the run has ended.
async function live() {
  const state = document.getElementById("live");
  for (let wait = 1000; ; wait = Math.min(2 * wait, 15_000)) {
    let fresh = true, ended = false;
    try {
      state.textContent = "connected";
      await follow(runPath(runId, "/events"), (name, data) => {
        if (name !== "update") return;
        const update = JSON.parse(data);
        onUpdate(update, fresh);
        fresh = false;
        wait = 1000;
        ended = ["finished", "stopped"].includes(update.info.status);
      });
      if (ended) { state.textContent = "ended"; return; }
    } catch (error) {
      if (error instanceof ApiError && [401, 404].includes(error.status)) {
        state.textContent = "–";
        document.getElementById("run-error").textContent = error.message;
        return;
      }
    }
    state.textContent = "reconnecting…";
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
}

withToken(() => {
  document.getElementById("app").hidden = false;
  if (!runId) {
    document.getElementById("run-error").textContent = "no run id: open a run from the runs page";
    return;
  }
  charts = {
    accuracy: chart("accuracy-chart", [["test accuracy", "#1f77b4"], ["federated accuracy", "#17becf"]], "%"),
    loss: chart("loss-chart", [["train loss", "#d62728"], ["test loss", "#2ca02c"]], "loss"),
    energy: chart("energy-chart", [["energy per round", "#ff7f0e"], ["cumulative", "#9467bd"]], "J"),
  };
  live();
});
