// The playground: the form, one streamed /generate request at a time, its tokens and its latency.
// The server validates every field: the page sends what was typed and shows the server's message beside the
// field it names.

import {APIError, generateEvents, getJSON, storedKey, storeKey} from "./api.js";
import {startMetricsPanel} from "./metrics_panel.js";
import {TokenOutput} from "./tokens.js";

const $ = (id) => document.getElementById(id);
const NUMBER_FIELDS = ["max_new_tokens", "temperature", "top_k", "top_p", "seed"];
const ALTERNATIVES = 5; // alternatives per token: the most /generate's logprobs gives
// JSON's number grammar: such text is sent as the number it spells, digit for digit (a seed beyond 2^53 too).
const JSON_NUMBER = /^-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?$/;

const output = new TokenOutput($("output"), $("token-detail"));
let running = null; // the AbortController of the request in flight

function status(text) {
  $("status").textContent = text;
}

// ---- the server and its limits ----

function describeServer(health) {
  $("model-line").textContent = `${health.model}: ${health.artifact} model on ${health.device}, context ` +
    `${health.context} tokens, up to ${health.max_batch_size} sequences batched`;
}

// A field's numeric bounds from its JSON schema (a nullable field has them in its non-null branch).
function bounds(property) {
  return Object.assign({}, property, ...(property.anyOf || []));
}

function number(value) {
  return Number.isSafeInteger(value) || !Number.isInteger(value) ? String(value) : `about ${value.toExponential(2)}`;
}

function showLimits(schema, health) {
  const fields = schema.components.schemas.GenerateRequest.properties;
  const limit = (id, text) => { $(`limits-${id}`).textContent = text; };
  const defaults = (id) => (fields[id].default === undefined ? "" : `; default ${fields[id].default}`);
  const newTokens = bounds(fields.max_new_tokens);
  limit("max_new_tokens", `${newTokens.minimum}–${health.context}: prompt + new tokens fit the context of ` +
    `${health.context}${defaults("max_new_tokens")}`);
  const temperature = bounds(fields.temperature);
  limit("temperature", `${temperature.minimum}–${temperature.maximum}, 0 greedy${defaults("temperature")}`);
  limit("top_k", `${bounds(fields.top_k).minimum}–${health.vocab_size}; empty: all tokens`);
  const topP = bounds(fields.top_p);
  limit("top_p", `above ${topP.exclusiveMinimum}, up to ${topP.maximum}; empty: 1`);
  const seed = bounds(fields.seed);
  limit("seed", `${seed.minimum}–${number(seed.maximum)}; empty: random`);
  const [one, list] = fields.stop.anyOf;
  limit("stop", `up to ${list.maxItems}, ${one.minLength}–${one.maxLength} characters each; \\n is a line break`);
  for (const id of NUMBER_FIELDS) {
    if (fields[id].default !== undefined) $(id).placeholder = String(fields[id].default);
  }
}

// ---- the API key ----

function askForKey(message) {
  $("key-section").hidden = false;
  $("error-api_key").textContent = message;
  $("api_key").setAttribute("aria-invalid", message ? "true" : "false");
  $("api_key").focus();
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  storeKey($("api_key").value.trim());
  $("api_key").value = "";
  $("key-section").hidden = true;
  status("API key kept for this tab");
  $("prompt").focus();
});

// ---- the request ----

// Each stop string on its own line; \n, \t and \\ spell a line break, a tab and a backslash.
function stopStrings(text) {
  const escapes = {n: "\n", t: "\t", "\\": "\\"};
  return text.split("\n").filter((line) => line !== "")
    .map((line) => line.replace(/\\([nt\\])/g, (_, c) => escapes[c]));
}

// The body as JSON text: number fields as typed, so that the server, not the page, judges them.
function requestBody() {
  const body = {prompt: $("prompt").value, stream: true, logprobs: ALTERNATIVES};
  const stop = stopStrings($("stop").value);
  if (stop.length) body.stop = stop;
  const numbers = [];
  for (const id of NUMBER_FIELDS) {
    const text = $(id).value.trim();
    if (text !== "") numbers.push(`,${JSON.stringify(id)}:${JSON_NUMBER.test(text) ? text : JSON.stringify(text)}`);
  }
  return JSON.stringify(body).slice(0, -1) + numbers.join("") + "}";
}

function clearErrors() {
  for (const element of document.querySelectorAll(".field-error")) element.textContent = "";
  for (const element of document.querySelectorAll("[aria-invalid]")) element.removeAttribute("aria-invalid");
}

function showError(error) {
  if (!(error instanceof APIError)) {
    $("error-body").textContent = `The server could not be reached: ${error.message}`;
    return;
  }
  if (error.status === 401) {
    storeKey("");
    askForKey(error.message);
    return;
  }
  const retry = error.retryAfter ? ` (retry after ${error.retryAfter} s)` : "";
  const field = (error.param || "").replace(/\[\d+\]$/, ""); // "stop[1]" is the stop field
  const beside = $(`error-${field}`) || $("error-body");
  beside.textContent = error.message + retry;
  if (field && $(field)) {
    $(field).setAttribute("aria-invalid", "true");
    $(field).focus();
  }
}

function figure(id, value, format) {
  const element = $(id);
  element.textContent = value === null ? "–" : format(value);
  element.dataset.value = value === null ? "" : String(value);
}

const ms = (value) => `${value.toFixed(1)} ms`;
const plain = (value) => String(value);

function showLatency(done) {
  const latency = done.latency;
  // The tokens after the first share the time after it.
  const perToken = done.tokens > 1 ? (latency.total_ms - latency.time_to_first_token_ms) / (done.tokens - 1) : null;
  figure("latency-queue_ms", latency.queue_ms, ms);
  figure("latency-time_to_first_token_ms", latency.time_to_first_token_ms, ms);
  figure("latency-per_token_ms", perToken, ms);
  figure("latency-total_ms", latency.total_ms, ms);
  figure("latency-tokens_per_s", latency.tokens_per_s, (value) => value.toFixed(1));
  figure("latency-tokens", done.tokens, plain);
  figure("latency-finish_reason", done.finish_reason, plain);
  const speculative = done.speculative;
  $("speculative").hidden = !speculative;
  if (!speculative) return;
  figure("speculative-draft_tokens_proposed", speculative.draft_tokens_proposed, plain);
  figure("speculative-draft_tokens_accepted", speculative.draft_tokens_accepted, plain);
  figure("speculative-acceptance_rate", speculative.acceptance_rate, (value) => `${(100 * value).toFixed(1)}%`);
  figure("speculative-tokens_per_target_pass", speculative.tokens_per_target_pass, (value) => value.toFixed(2));
}

function clearLatency() {
  for (const element of document.querySelectorAll("#latency dd")) figure(element.id, null, plain);
}

async function generate() {
  if (running) return;
  clearErrors();
  clearLatency();
  const controller = new AbortController();
  running = controller;
  $("generate").disabled = true;
  $("stop-button").disabled = false;
  output.clear($("prompt").value);
  status("waiting for the first token…");
  let tokens = 0;
  let done = null;
  try {
    for await (const [event, data] of generateEvents(requestBody(), controller.signal)) {
      if (event === "token") {
        output.add(data);
        if (data.token !== null) status(`generating… ${++tokens} tokens`);
      } else if (event === "done") {
        done = data;
        showLatency(done);
      } else if (event === "error") {
        throw new APIError(null, data);
      }
    }
    status(done ? `done: ${done.tokens} tokens, finished by ${done.finish_reason}` :
      "the stream ended before its last event");
  } catch (error) {
    if (controller.signal.aborted) status(`stopped after ${tokens} tokens; the server cancelled the request`);
    else {
      status("");
      showError(error);
    }
  } finally {
    running = null;
    $("generate").disabled = false;
    $("stop-button").disabled = true;
  }
}

function stop() {
  if (running) running.abort();
}

// ---- wiring ----

$("generate-form").addEventListener("submit", (event) => {
  event.preventDefault();
  generate();
});
$("stop-button").addEventListener("click", stop);
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    $("generate-form").requestSubmit();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && running) stop();
});

startMetricsPanel({
  batchNow: $("now-batch"), queueNow: $("now-queue"), tokensNow: $("now-tokens"), cancelledNow: $("now-cancelled"),
  batchChart: $("chart-batch"), queueChart: $("chart-queue"), tokensChart: $("chart-tokens"),
});

try {
  const [health, schema] = await Promise.all([getJSON("/health"), getJSON("/openapi.json")]);
  describeServer(health);
  showLimits(schema, health);
  if (health.api_key_required && !storedKey()) askForKey("");
} catch (error) {
  $("model-line").textContent = `The server did not answer: ${error.message}`;
}
