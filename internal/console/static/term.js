// A minimal terminal renderer: a grid of rows × cols cells fed with the
// bytes of a PTY, enough for a shell and line-oriented programs (cursor
// movement, erase, carriage return, backspace, tabs, scrolling). Colours
// and other attributes are parsed and dropped. The screen is rendered as
// text (textContent), so nothing the sandbox prints can become markup.

export class Screen {
  constructor(rows, cols, reply) {
    this.rows = rows; this.cols = cols; this.reply = reply || (() => {});
    this.lines = Array.from({ length: rows }, () => []);
    this.x = 0; this.y = 0;
    this.state = "text"; this.params = "";
    this.decoder = new TextDecoder();
  }

  write(bytes) {
    for (const ch of this.decoder.decode(bytes, { stream: true })) this.put(ch);
  }

  put(ch) {
    switch (this.state) {
      case "esc":
        if (ch === "[") { this.state = "csi"; this.params = ""; }
        else if (ch === "]") { this.state = "osc"; }
        else if (ch === "(" || ch === ")") { this.state = "charset"; }
        else this.state = "text";
        return;
      case "charset": this.state = "text"; return;
      case "osc":
        if (ch === "\x07") this.state = "text";
        else if (ch === "\x1b") this.state = "esc"; // ST: ESC \
        return;
      case "csi":
        if (ch >= "@" && ch <= "~") { this.state = "text"; this.csi(ch, this.params); }
        else this.params += ch;
        return;
    }
    switch (ch) {
      case "\x1b": this.state = "esc"; return;
      case "\r": this.x = 0; return;
      case "\n": this.lf(); return;
      case "\b": if (this.x > 0) this.x--; return;
      case "\t": this.x = Math.min(this.cols - 1, (this.x + 8) & ~7); return;
      case "\x07": return;
    }
    if (ch < " ") return;
    if (this.x >= this.cols) { this.x = 0; this.lf(); }
    const line = this.lines[this.y];
    while (line.length < this.x) line.push(" ");
    line[this.x++] = ch;
  }

  lf() {
    if (this.y === this.rows - 1) { this.lines.shift(); this.lines.push([]); }
    else this.y++;
  }

  csi(final, params) {
    const priv = params.startsWith("?");
    const n = (priv ? params.slice(1) : params).split(";").map((p) => parseInt(p, 10));
    const a = (i, d) => (Number.isFinite(n[i]) && n[i] > 0 ? n[i] : d);
    const line = this.lines[this.y];
    switch (final) {
      case "A": this.y = Math.max(0, this.y - a(0, 1)); break;
      case "B": this.y = Math.min(this.rows - 1, this.y + a(0, 1)); break;
      case "C": this.x = Math.min(this.cols - 1, this.x + a(0, 1)); break;
      case "D": this.x = Math.max(0, this.x - a(0, 1)); break;
      case "G": this.x = Math.min(this.cols - 1, a(0, 1) - 1); break;
      case "H": case "f": this.y = Math.min(this.rows - 1, a(0, 1) - 1); this.x = Math.min(this.cols - 1, a(1, 1) - 1); break;
      case "K": {
        const m = n[0] || 0;
        if (m === 0) line.length = Math.min(line.length, this.x);
        else if (m === 1) for (let i = 0; i <= this.x && i < line.length; i++) line[i] = " ";
        else line.length = 0;
        break;
      }
      case "J": {
        const m = n[0] || 0;
        if (m === 2 || m === 3) { this.lines = Array.from({ length: this.rows }, () => []); }
        else if (m === 0) { line.length = Math.min(line.length, this.x); for (let i = this.y + 1; i < this.rows; i++) this.lines[i] = []; }
        break;
      }
      case "P": line.splice(this.x, a(0, 1)); break;
      case "@": line.splice(this.x, 0, ...Array(a(0, 1)).fill(" ")); break;
      case "n": if (n[0] === 6) this.reply(`\x1b[${this.y + 1};${this.x + 1}R`); break;
      default: break; // m (attributes), h/l (modes), r (scroll region): ignored
    }
  }

  text() {
    return this.lines.map((l) => l.join("").replace(/\s+$/, "")).join("\n");
  }
}

// keyBytes maps a keydown to what a terminal sends, or "" for none.
export function keyBytes(e) {
  if (e.ctrlKey && !e.altKey && e.key.length === 1) {
    const c = e.key.toLowerCase().charCodeAt(0);
    if (c >= 97 && c <= 122) return String.fromCharCode(c - 96);
    if (e.key === "[") return "\x1b";
    return "";
  }
  const map = {
    Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b",
    ArrowUp: "\x1b[A", ArrowDown: "\x1b[B", ArrowRight: "\x1b[C", ArrowLeft: "\x1b[D",
    Home: "\x1b[H", End: "\x1b[F", Delete: "\x1b[3~",
  };
  if (map[e.key]) return map[e.key];
  if (e.key.length === 1 && !e.metaKey) return (e.altKey ? "\x1b" : "") + e.key;
  return "";
}
