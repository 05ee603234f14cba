// Numbers and times as people read them.

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  let v = Number(n);
  let i = 0;
  while (Math.abs(v) >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 2 : 1)} ${UNITS[i]}`;
}

export function ago(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.max(0, seconds);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function when(epochSeconds) {
  if (epochSeconds === null || epochSeconds === undefined) return "—";
  return new Date(epochSeconds * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** The commit time of a checkpoint id (a ULID: its first 10 characters are milliseconds). */
export function ulidSeconds(id) {
  if (!id || id.length < 10) return null;
  let ms = 0;
  for (const c of id.slice(0, 10).toUpperCase()) {
    const v = CROCKFORD.indexOf(c);
    if (v < 0) return null;
    ms = ms * 32 + v;
  }
  return ms / 1000;
}

export function rfcSeconds(text) {
  const t = Date.parse(text);
  return Number.isNaN(t) ? null : t / 1000;
}

export function shortId(id) {
  return id ? id.slice(-8) : "";
}

/** A metadata value as one line of text. */
export function value(v) {
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}
