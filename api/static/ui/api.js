// The API as the page uses it: every call carries the token from this tab's
// sessionStorage in the Authorization header (never in a URL); errors become ApiError.

const KEY = "ckpt.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

/** A path under /v1 with each segment of a namespace or file name escaped. */
export function path(...parts) {
  return parts
    .map((p) => String(p).split("/").map(encodeURIComponent).join("/"))
    .join("/");
}

async function request(method, url, body) {
  const headers = { Authorization: `Bearer ${token.get() || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
  });
  if (resp.ok) return resp;
  let code = "http_" + resp.status;
  let message = `${method} ${url}: ${resp.status}`;
  try {
    const err = (await resp.json()).error;
    code = err.code;
    message = err.message;
  } catch {
    // not a JSON error body: keep the status line
  }
  throw new ApiError(resp.status, code, message);
}

export async function get(url) {
  return (await request("GET", url)).json();
}

export async function send(method, url, body) {
  const resp = await request(method, url, body);
  return resp.status === 204 ? null : resp.json();
}

/** Fetch a file with the token and hand it to the browser as a download. */
export async function download(url, name) {
  const blob = await (await request("GET", url)).blob();
  const href = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = href;
  a.download = name.split("/").pop() || "file";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(href), 60000);
}
