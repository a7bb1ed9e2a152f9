// The topology: the cloud, each site of its registry and the devices each site reported, refreshed every 2 s.
import { ApiError, api, element, when, withToken } from "./api.js";

const REFRESH_MS = 2000;
const STATES = ["failed", "uploading", "training", "idle", "offline"];
let timer = null;

const count = (site, state) => site.states[state] ?? 0;

function deviceRow(d) {
  return element("tr", { "data-device": d.client_id, "data-state": d.state },
    element("td", { class: "num" }, String(d.client_id)),
    element("td", {}, element("span", { class: `status ${d.state}` }, d.state)),
    element("td", { class: "reason" }, d.failure ? `${d.failure} (run ${d.failed_run})` : "–"),
    element("td", {}, when(d.last_seen)),
    element("td", { class: "num" }, d.samples === null ? "–" : String(d.samples)),
    element("td", {}, d.family ?? "–"),
    element("td", {}, d.runs.join(", ") || "–"));
}

function site(s) {
  const total = s.devices ?? 0;
  const listed = s.device_page.length;
  const labels = Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(", ");
  const [run, version] = s.serving ? s.serving.split(":") : [null, null];
  return element("div", { class: "node site", "data-site": s.name, "data-status": s.status },
    element("h3", {}, `${s.name} `, element("span", { class: `status ${s.status}` }, s.status),
      element("span", { class: "muted" }, ` edge ${s.edge_id}${labels ? ` · ${labels}` : ""}`)),
    element("dl", { class: "facts" },
      element("div", {}, element("dt", {}, "last seen"), element("dd", {}, when(s.last_seen))),
      element("div", {}, element("dt", {}, "serving"), element("dd", {}, run
        ? element("a", { href: `run.html?id=${run}` }, `run ${run}, version ${version}`) : "–")),
      element("div", {}, element("dt", {}, "public URL"), element("dd", {}, s.url ?? "–")),
      element("div", {}, element("dt", {}, "devices connected / registered"),
        element("dd", { class: "connected" }, `${total - count(s, "offline")} / ${total}`)),
      element("div", {}, element("dt", {}, "per state"), element("dd", { class: "states" },
        STATES.filter((state) => count(s, state)).map((state) => `${state} ${count(s, state)}`).join(" · ") || "–"))),
    listed ? element("div", { class: "scroll" }, element("table", { class: "grid devices" },
      element("thead", {}, element("tr", {}, ...["device", "state", "failure", "last seen", "samples", "family", "runs"]
        .map((h) => element("th", {}, h)))),
      element("tbody", {}, ...s.device_page.map(deviceRow)))) : null,
    listed < total ? element("p", { class: "muted" }, `${listed} of ${total} devices listed (failed ones first); ` +
      `the site's own registry lists every one: GET ${s.url ?? "<its URL>"}/api/v1/devices`) : null);
}

async function refresh() {
  clearTimeout(timer);
  try {
    const sites = await api("/api/v1/sites");
    document.getElementById("sites").replaceChildren(...sites.map(site));
    document.getElementById("no-sites").hidden = sites.length > 0;
    document.getElementById("topology-error").textContent = "";
    document.getElementById("topology-live").textContent = `as of ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("topology-error").textContent = `could not read the site registry: ${error.message}`;
    if (error instanceof ApiError && error.status === 401) return;  // the token form is showing
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

withToken(() => {
  document.getElementById("app").hidden = false;
  refresh();
});
