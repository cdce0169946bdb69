// The live panel: polls GET /metrics while the page is visible and plots the last minutes by hand, in SVG.

const POLL_MS = 2000;
const WINDOW_MS = 5 * 60 * 1000;

// Prometheus text to {series: value}; a series is its name with its labels, as written.
function samples(text) {
  const values = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const cut = line.lastIndexOf(" ");
    values[line.slice(0, cut)] = Number(line.slice(cut + 1));
  }
  return values;
}

// A metric summed over its labels.
function total(values, name) {
  let sum = 0;
  for (const [series, value] of Object.entries(values)) {
    if (series === name || series.startsWith(`${name}{`)) sum += value;
  }
  return sum;
}

function draw(svg, history, key, now) {
  const [, , width, height] = svg.getAttribute("viewBox").split(" ").map(Number);
  const top = Math.max(1, ...history.map((point) => point[key])) * 1.15;
  const floor = height - 2; // zero stays in view, above the chart's bottom edge
  // The time since the first poll fills the width until it reaches the window.
  const span = Math.min(WINDOW_MS, Math.max(POLL_MS, now - history[0].time));
  const points = history.map((point) => {
    const x = width * (1 - (now - point.time) / span);
    const y = floor * (1 - point[key] / top);
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  svg.querySelector("polyline").setAttribute("points", points.join(" "));
}

export function startMetricsPanel(elements) {
  const history = [];
  let previous = null;

  async function poll() {
    let values;
    try {
      values = samples(await (await fetch("/metrics")).text());
    } catch {
      elements.batchNow.textContent = "unreachable";
      return;
    }
    const time = performance.now();
    const generated = total(values, "serve_generated_tokens_total");
    const tokensPerS = previous ? (generated - previous.generated) / ((time - previous.time) / 1000) : 0;
    previous = {time, generated};
    history.push({time, batch: total(values, "serve_batch_size"), queue: total(values, "serve_queue_depth"),
                  tokens: tokensPerS});
    while (history.length && time - history[0].time > WINDOW_MS) history.shift();
    const last = history[history.length - 1];
    elements.batchNow.textContent = String(last.batch);
    elements.queueNow.textContent = String(last.queue);
    elements.tokensNow.textContent = last.tokens.toFixed(1);
    elements.cancelledNow.textContent = String(total(values, "serve_requests_cancelled_total"));
    draw(elements.batchChart, history, "batch", time);
    draw(elements.queueChart, history, "queue", time);
    draw(elements.tokensChart, history, "tokens", time);
  }

  // A hidden tab asks nothing of the server, and a closed one nothing at all.
  poll();
  setInterval(() => {
    if (!document.hidden) poll();
  }, POLL_MS);
}
