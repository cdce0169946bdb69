// The output: each generated token shaded by its probability; hovering or focusing one shows its alternatives.

// Red for an unlikely token through yellow to green for a likely one (the page's legend draws the same scale).
export function shade(probability) {
  return `hsl(${Math.round(120 * probability)} 75% 82%)`;
}

// Whitespace made visible in the alternatives' list, where a bare space would show as nothing.
function visible(text) {
  return text.replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
}

function percent(probability) {
  if (probability < 0.001) return probability.toExponential(1);
  return `${(100 * probability).toFixed(probability < 0.1 ? 2 : 1)}%`;
}

export class TokenOutput {
  constructor(container, detail) {
    this.container = container;
    this.detail = detail;
    this.hint = detail.textContent;
    this.entries = [];
    container.addEventListener("mouseover", (event) => {
      const token = event.target.closest(".tok");
      if (token) this.show(token);
    });
    container.addEventListener("focusin", (event) => {
      if (event.target.classList.contains("tok")) this.show(event.target);
    });
    container.addEventListener("keydown", (event) => this.move(event));
  }

  clear(prompt) {
    const shown = document.createElement("span");
    shown.className = "prompt";
    shown.textContent = prompt;
    this.container.replaceChildren(shown);
    this.entries = [];
    this.detail.textContent = this.hint;
  }

  // One token event's data: its text (which may be empty while a character is incomplete), and with the
  // request's logprobs, its log-probability and alternatives.
  add(data) {
    if (!data.text) return;
    const span = document.createElement("span");
    span.textContent = data.text;
    if (data.logprob !== undefined) {
      const probability = Math.exp(data.logprob);
      span.className = "tok";
      span.tabIndex = -1;
      span.dataset.index = String(this.entries.length);
      span.dataset.probability = String(probability);
      span.style.setProperty("background-color", shade(probability));
      this.entries.push(data);
    }
    this.container.append(span);
  }

  show(span) {
    const entry = this.entries[Number(span.dataset.index)];
    const head = document.createElement("div");
    const chosen = document.createElement("strong");
    chosen.textContent = visible(span.textContent);
    head.append(chosen, ` p ${percent(Math.exp(entry.logprob))} (log ${entry.logprob.toFixed(3)})`);
    const list = document.createElement("ol");
    for (const alternative of entry.top_logprobs) {
      const p = Math.exp(alternative.logprob);
      const item = document.createElement("li");
      if (alternative.token === entry.token) item.className = "chosen";
      const text = document.createElement("code");
      text.textContent = visible(alternative.text);
      const bar = document.createElement("span");
      bar.className = "bar";
      bar.style.setProperty("width", `${Math.max(1, 100 * p)}%`);
      item.append(text, percent(p), bar);
      list.append(item);
    }
    this.detail.replaceChildren(head, list);
  }

  // Arrow keys move between tokens, Home and End to the first and last: one Tab stop for the whole output.
  move(event) {
    const tokens = [...this.container.querySelectorAll(".tok")];
    if (!tokens.length) return;
    const at = tokens.indexOf(document.activeElement);
    const next = {ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0,
                  End: tokens.length - 1}[event.key];
    if (next === undefined) return;
    event.preventDefault();
    tokens[Math.min(Math.max(at < 0 ? 0 : next, 0), tokens.length - 1)].focus();
  }
}
