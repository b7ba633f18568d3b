// Every call the dashboard makes goes through here: the public REST API,
// with the bearer token (asked for once, kept in sessionStorage) when the
// server wants one.
const TOKEN_KEY = "jackdaw.token";
let asking = null; // the pending token prompt, shared by concurrent calls

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function headers(extra) {
  const h = new Headers(extra || {});
  const t = token();
  if (t) h.set("Authorization", `Bearer ${t}`);
  return h;
}

// Show the token dialog until the user gives a token; resolves then.
function askToken(wrong) {
  if (asking) return asking;
  const dlg = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  const err = document.getElementById("token-error");
  err.hidden = !wrong;
  err.textContent = wrong ? "That token was refused. Try again." : "";
  input.value = "";
  asking = new Promise((resolve) => {
    const done = (ev) => {
      ev.preventDefault();
      if (!input.value) return;
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      form.removeEventListener("submit", done);
      dlg.close();
      asking = null;
      resolve();
    };
    form.addEventListener("submit", done);
    dlg.addEventListener("cancel", (ev) => ev.preventDefault(), { once: true });
    dlg.showModal();
    input.focus();
  });
  return asking;
}

// fetch with the token; a 401 asks for the token and tries again.
export async function raw(path, init = {}) {
  for (;;) {
    const res = await fetch(path, { ...init, headers: headers(init.headers), cache: "no-store" });
    if (res.status !== 401) return res;
    const had = token() !== null;
    sessionStorage.removeItem(TOKEN_KEY);
    await askToken(had);
  }
}

async function parse(res) {
  const text = await res.text();
  let body = null;
  if (text) {
    try { body = JSON.parse(text); } catch { body = { detail: text }; }
  }
  if (!res.ok) throw new ApiError(res.status, body);
  return body;
}

export async function get(path) {
  return parse(await raw(path));
}

export async function post(path, body) {
  const init = { method: "POST" };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { "Content-Type": "application/json" };
  }
  return parse(await raw(path, init));
}

// A Server-Sent Events stream over fetch (EventSource cannot send the
// token). onEvent(kind, data, id) per event; resumes after the last id when
// the connection drops, until the server sends "end" or stop() is called.
export function stream(path, onEvent, onState) {
  const ctl = new AbortController();
  let last = null;
  let stopped = false;
  (async () => {
    while (!stopped) {
      try {
        const h = { Accept: "text/event-stream" };
        if (last !== null) h["Last-Event-ID"] = String(last);
        const res = await raw(path, { headers: h, signal: ctl.signal });
        if (!res.ok) throw new ApiError(res.status, await res.json().catch(() => null));
        onState?.(true);
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            let kind = "message", data = "", id = null;
            for (const line of block.split("\n")) {
              if (line.startsWith(":")) continue;
              const i = line.indexOf(":");
              const field = i < 0 ? line : line.slice(0, i);
              const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
              if (field === "event") kind = val;
              else if (field === "data") data += (data ? "\n" : "") + val;
              else if (field === "id") id = val;
            }
            if (id !== null) last = id;
            if (kind === "end") { stopped = true; onState?.(false, "end"); return; }
            if (data) onEvent(kind, JSON.parse(data), id);
          }
        }
      } catch (e) {
        if (stopped || e.name === "AbortError") return;
        if (e instanceof ApiError && e.status < 500 && e.status !== 429) { onState?.(false, e); return; }
      }
      onState?.(false);
      if (!stopped) await new Promise((r) => setTimeout(r, 1500));
    }
  })();
  return { stop() { stopped = true; ctl.abort(); } };
}
