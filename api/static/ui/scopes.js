// What a token may do, from the scopes GET /v1/whoami tells it: the same rules as
// api/auth.py (admin: everything; read:/write:/delete:<glob> matched with fnmatch rules,
// where `*` also crosses `/`). The server decides; this only hides what it would refuse.

function globToRegExp(glob) {
  let re = "";
  for (let i = 0; i < glob.length; i += 1) {
    const c = glob[i];
    if (c === "*") re += ".*";
    else if (c === "?") re += ".";
    else if (c === "[") {
      const end = glob.indexOf("]", i + 2);
      if (end < 0) {
        re += "\\[";
      } else {
        let set = glob.slice(i + 1, end).replace(/\\/g, "\\\\");
        if (set.startsWith("!")) set = "^" + set.slice(1);
        re += `[${set}]`;
        i = end;
      }
    } else re += c.replace(/[.+^${}()|\\\]]/g, "\\$&");
  }
  return new RegExp(`^${re}$`, "s");
}

export class Scopes {
  constructor(who) {
    this.name = who.name;
    this.scopes = who.scopes;
    this.admin = Boolean(who.admin);
  }

  may(action, ns) {
    if (this.admin) return true;
    const prefix = action + ":";
    return this.scopes.some(
      (s) => s.startsWith(prefix) && globToRegExp(s.slice(prefix.length)).test(ns),
    );
  }
}
