// The server's API as the web pages call it: with the API key the server wants (asked for once per browser tab,
// kept in sessionStorage), and a failure as an Error that says what went wrong. Plain script, shared by the pages.
"use strict";

const KEY_STORE = "backchannel-api-key";

async function api(method, path, {body, signal} = {}) {
  for (let attempt = 0; ; attempt++) {
    const headers = body === undefined ? {} : {"content-type": "application/json"};
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers["x-api-key"] = key;
    const response = await fetch(path, {method, headers, signal,
                                        body: body === undefined ? undefined : JSON.stringify(body)});
    if (response.status === 401 && attempt < 3) {
      const entered = window.prompt("This server wants an API key (the x-api-key it was started with):");
      if (!entered) throw new Error("the server needs an API key");
      sessionStorage.setItem(KEY_STORE, entered.trim());
      continue;
    }
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
      throw new Error(`${method} ${path.split("?")[0]} failed (${response.status}): ${detail}`);
    }
    return response;
  }
}
