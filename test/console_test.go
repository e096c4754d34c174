package test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	agentbox "github.com/agentbox/agentbox/sdk/go"

	"github.com/agentbox/agentbox/internal/testutil"
)

// TestConsoleInBrowser drives the web console (/ui/, docs/CONSOLE.md) in a
// real headless Chromium against a daemon on loopback TCP: log in with an
// API key, see the workload's sandbox, open its timeline (and follow it),
// see a file diff, restore a checkpoint from the tree, type a command into
// the terminal and see its output, see the admin's tenants page. On every
// page: the canary secret is nowhere in the DOM, and a file named like
// markup renders as text and runs nothing. A screenshot of each page is
// saved into $AGENTBOX_SCREENSHOTS (a new temp dir by default; logged).
func TestConsoleInBrowser(t *testing.T) {
	testutil.RequiresRoot(t)
	chromium := testutil.RequiresBinary(t, "chromium")
	d, addr, key := tcpDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The workload: a secret used by a run, file edits, a failing
	// command, a checkpoint, a file named like markup.
	canary := "canary-" + randHex(12)
	if _, err := d.client.SetSecret(ctx, "CONSOLE_CANARY", []byte(canary)); err != nil {
		t.Fatal(err)
	}
	sb := d.create(t, agentbox.SandboxSpec{Name: "console-demo"})
	mustRun(t, sb, "mkdir -p /work && echo hello > /work/notes.txt")
	mustRun(t, sb, `echo "token is $CANARY"`, agentbox.WithSecret("CONSOLE_CANARY", "CANARY"))
	if _, err := sb.Checkpoint(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "echo changed-line >> /work/notes.txt")
	const markupName = `<img src=x onerror="window.pwned=1"><script>window.pwned=2<script>.txt`
	mustRun(t, sb, "touch /work/'"+markupName+"'")
	if res := run(t, sb, "echo failing >&2; exit 3"); res.ExitCode != 3 {
		t.Fatalf("failing command: exit %d", res.ExitCode)
	}

	// The console's pages carry a strict policy.
	resp, err := http.Get("http://" + addr + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") ||
		resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("GET /ui/: CSP %q, X-Frame-Options %q", csp, resp.Header.Get("X-Frame-Options"))
	}

	shots := os.Getenv("AGENTBOX_SCREENSHOTS")
	if shots == "" {
		var err error
		if shots, err = os.MkdirTemp("", "agentbox-console-screenshots-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("console screenshots: %s", shots)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	if os.Geteuid() == 0 {
		// Chromium refuses to start as root with its sandbox on (it needs
		// an unprivileged user for its setuid/user-namespace sandbox);
		// CI runs this suite as root. The page is our own console on
		// loopback, not untrusted web content.
		opts = append(opts, chromedp.NoSandbox)
	}
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer bcancel()
	// The first Run starts the browser for the life of its context: bctx,
	// not one page's timeout.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}

	base := "http://" + addr + "/ui/"
	page := func(name string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		tctx, tcancel := context.WithTimeout(bctx, 60*time.Second)
		defer tcancel()
		actions = append(actions, chromedp.Sleep(300*time.Millisecond)) // let the last frame paint
		if err := chromedp.Do(tctx, actions...); err != nil {
			dom, _ := chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("html")))
			t.Fatalf("page %s: %v\nDOM: %s", name, err, tail(dom, 3000))
		}
		png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100)) // 100: PNG (lower is JPEG)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(shots, name+".png")
		if err := os.WriteFile(file, png, 0o644); err != nil {
			t.Fatal(err)
		}
		dom, err := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("html")))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(dom, canary) {
			t.Errorf("page %s shows the canary secret", name)
		}
		if pwned, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.pwned !== undefined`)); err != nil || pwned {
			t.Errorf("page %s ran script from a file name (%v)", name, err)
		}
		t.Logf("page %s: %s", name, file)
	}
	evalTrue := func(expr string) chromedp.Action[chromedp.Void] {
		// A page still rendering may not have the elements yet: false.
		return chromedp.Poll[chromedp.Void](`(() => { try { return !!(`+expr+`); } catch { return false; } })()`, chromedp.WithPollingTimeout(30*time.Second))
	}
	// Login: a wrong key is refused, the right one opens the list.
	page("01-login",
		chromedp.Navigate(base),
		chromedp.WaitVisible(chromedp.ID("#api-key")),
		chromedp.SendKeys(chromedp.ID("#api-key"), "wrong-key"),
		chromedp.Click(chromedp.ID("#login-submit")),
		evalTrue(`document.querySelector('#login [role=alert]').textContent.includes('not accepted')`),
	)
	row := fmt.Sprintf(`tr[data-sandbox=%q]`, sb.ID())
	page("02-sandboxes",
		chromedp.SendKeys(chromedp.ID("#api-key"), key),
		chromedp.Click(chromedp.ID("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS(row)),
		evalTrue(fmt.Sprintf(`document.querySelector(%q).textContent.includes('console-demo') && document.querySelector(%q).textContent.includes('running')`, row, row)),
	)
	stored, err := chromedp.Run(bctx, chromedp.Evaluate[string](`sessionStorage.getItem('agentbox.apiKey') + '|' + document.cookie`))
	if err != nil {
		t.Fatal(err)
	}
	if stored != key+"|" {
		t.Errorf("key storage: got %q, want the key in sessionStorage and no cookie", stored)
	}

	// The timeline: runs with their file effects, the failing run, and a
	// run made while following appears without a reload.
	page("03-timeline",
		chromedp.Click(chromedp.CSS(row+" a")),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-type="run.ended"]`)),
		evalTrue(`[...document.querySelectorAll('#timeline .effects li[data-type="file.changed"]')].some(e => e.textContent.includes('/work/notes.txt'))`),
		evalTrue(`document.getElementById('timeline').textContent.includes('exit 3')`),
		evalTrue(`document.getElementById('timeline').textContent.includes('echo changed-line')`),
		// The markup-named file is listed as text.
		evalTrue(fmt.Sprintf(`[...document.querySelectorAll('#timeline .file-path')].some(e => e.textContent.includes(%q))`, markupName)),
		chromedp.Click(chromedp.ID("#filter-files")),
		evalTrue(`document.querySelectorAll('#timeline li[data-type="file.changed"]').length === 0`),
		chromedp.Click(chromedp.ID("#filter-files")),
		chromedp.Click(chromedp.ID("#follow")),
		evalTrue(`document.getElementById('follow-status').textContent.includes('following')`),
	)
	mustRun(t, sb, "echo followed-run-marker")
	page("04-timeline-follow",
		evalTrue(`document.getElementById('timeline').textContent.includes('followed-run-marker')`),
	)
	if err := chromedp.Do(bctx, evalTrue(`!document.querySelector('#timeline img, #timeline script')`)); err != nil {
		t.Errorf("the timeline holds an element made from a file name: %v", err)
	}

	// The files tab: the markup-named file in the listing as text, the
	// diff of the checkpoint against the live files.
	page("05-files-diff",
		chromedp.Click(chromedp.ID("#tab-files")),
		chromedp.WaitVisible(chromedp.CSS(`#changes li[data-path="/work/notes.txt"]`)),
		evalTrue(`document.querySelector('#changes li[data-path="/work/notes.txt"] .unified').textContent.includes('+changed-line')`),
		evalTrue(fmt.Sprintf(`[...document.querySelectorAll('#changes .change-path')].some(e => e.textContent === %q)`, "/work/"+markupName)),
		chromedp.Click(chromedp.CSS(`#listing li[data-name="work"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#listing li[data-name="notes.txt"]`)),
		evalTrue(fmt.Sprintf(`[...document.querySelectorAll('#listing .entry')].some(e => e.textContent === %q)`, markupName)),
		chromedp.Click(chromedp.CSS(`#listing li[data-name="notes.txt"] a`)),
		evalTrue(`document.getElementById('file-content') && document.getElementById('file-content').textContent === 'hello\nchanged-line\n'`),
	)
	if err := chromedp.Do(bctx, evalTrue(`!document.querySelector('#listing img, #listing script, #changes img, #changes script')`)); err != nil {
		t.Errorf("the file browser holds an element made from a file name: %v", err)
	}

	// The tree: restore the checkpoint; the sandbox's files go back.
	page("06-tree-restore",
		chromedp.Click(chromedp.ID("#tab-tree")),
		chromedp.WaitVisible(chromedp.CSS(`#tree li[data-checkpoint] .restore`)),
		evalTrue(`document.getElementById('tree').textContent.includes('base')`),
		chromedp.Click(chromedp.CSS(`#tree li[data-checkpoint] .restore`)),
		evalTrue(`document.getElementById('tree-status').textContent.startsWith('Restored to base')`),
	)
	// Fork the checkpoint: the fork appears under it; deleting the
	// checkpoint a sandbox runs on is refused, and the page says so.
	page("07-tree-fork",
		chromedp.Click(chromedp.CSS(`#tree li[data-checkpoint] .fork`)),
		evalTrue(`document.getElementById('tree-status').textContent.startsWith('Forked: ')`),
		evalTrue(`document.querySelector('#tree li[data-checkpoint] ul a') !== null`),
		chromedp.Click(chromedp.CSS(`#tree li[data-checkpoint] .delete`)),
		evalTrue(`document.getElementById('tree-status').textContent.includes('failed')`),
	)
	forks, err := d.client.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		if f.ID() != sb.ID() && f.Info().Labels["console/forked-from"] != "" {
			t.Cleanup(func() { _ = f.Delete(context.Background()) })
		}
	}
	if got := mustRun(t, sb, "cat /work/notes.txt"); got != "hello\n" {
		t.Errorf("after the console's restore: /work/notes.txt = %q, want the checkpoint's %q", got, "hello\n")
	}

	// The terminal: a shell on a PTY over a WebSocket.
	page("08-terminal",
		chromedp.Click(chromedp.ID("#tab-terminal")),
		evalTrue(`document.getElementById('terminal-status').textContent === 'connected'`),
		chromedp.Click(chromedp.ID("#terminal")),
		chromedp.SendKeys(chromedp.ID("#terminal"), "echo console-$((6*7))\r"),
		evalTrue(`document.getElementById('terminal').textContent.includes('console-42')`),
	)

	// The admin's tenants page: usage, and secrets by name only.
	page("09-tenants",
		chromedp.Click(chromedp.ID("#nav-tenants")),
		chromedp.WaitVisible(chromedp.ID("#tenants")),
		evalTrue(`document.getElementById('secrets').textContent.includes('CONSOLE_CANARY')`),
	)
}

// TestConsoleOff: with --no-console the daemon serves no /ui/ (the path
// is an ordinary authenticated one) and accepts no same-origin browser
// request, while the API still answers its key.
func TestConsoleOff(t *testing.T) {
	testutil.RequiresRoot(t)
	addr := loopbackAddr(t)
	keyFile := filepath.Join(t.TempDir(), "keys")
	key := "test-key-" + randHex(16)
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	newDaemonWith(t, "--tcp", addr, "--api-keys-file", keyFile, "--no-console")
	get := func(path string, hdr ...string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("/ui/"); got != http.StatusUnauthorized {
		t.Errorf("GET /ui/ with the console off: %d, want 401", got)
	}
	if got := get("/v1/info", "Authorization", "Bearer "+key); got != http.StatusOK {
		t.Errorf("GET /v1/info: %d", got)
	}
	if got := get("/v1/info", "Authorization", "Bearer "+key, "Origin", "http://"+addr); got != http.StatusForbidden {
		t.Errorf("same-origin request with the console off: %d, want 403", got)
	}
}
