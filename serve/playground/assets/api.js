// The server's API as the page uses it: the API key, JSON requests, error bodies, and /generate's event stream.

const KEY_STORAGE = "gpt2-serve-api-key";

// The key lives in this tab's sessionStorage only: never in the URL, never in localStorage.
export function storedKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export function storeKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

// A refusal as the server words it: {"error": {"message", "type", "param", "code"}}.
export class APIError extends Error {
  constructor(status, body, retryAfter = null) {
    super(body?.error?.message || `the server answered HTTP ${status} with no message`);
    this.status = status;
    this.param = body?.error?.param ?? null;
    this.retryAfter = retryAfter;
  }
}

async function refusal(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not the server's JSON error (a proxy's page, say): the status alone
  }
  return new APIError(response.status, body, response.headers.get("Retry-After"));
}

export async function getJSON(path) {
  const response = await fetch(path);
  if (!response.ok) throw await refusal(response);
  return response.json();
}

// POST /generate with `body` (JSON text asking for a stream): yields [event name, data] as each event arrives.
// Aborting `signal` closes the connection, which the server notices and answers by cancelling the request.
export async function* generateEvents(body, signal) {
  const headers = {"Content-Type": "application/json"};
  const key = storedKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch("/generate", {method: "POST", headers, body, signal});
  if (!response.ok) throw await refusal(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      let data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      yield [name, JSON.parse(data)];
    }
  }
}
