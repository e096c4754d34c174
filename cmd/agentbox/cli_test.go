package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil/rawtar"
	agentbox "github.com/agentbox/agentbox/sdk/go"
	"github.com/agentbox/agentbox/sdk/go/agentboxtest"
)

// cli runs the agentbox command line in-process against srv.
func cli(t *testing.T, srv *agentboxtest.Server, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	if srv != nil {
		args = append([]string{"--host", srv.Host}, args...)
	}
	code = execute(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

func mustCLI(t *testing.T, srv *agentboxtest.Server, args ...string) string {
	t.Helper()
	out, errOut, code := cli(t, srv, "", args...)
	if code != 0 {
		t.Fatalf("agentbox %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func TestLs(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	a := srv.AddSandbox(api.CreateSandboxRequest{Labels: map[string]string{"team": "x", "env": "ci"}})
	srv.AddSandbox(api.CreateSandboxRequest{Labels: map[string]string{"team": "y"}})

	var all []api.Sandbox
	if err := json.Unmarshal([]byte(mustCLI(t, srv, "ls", "--json")), &all); err != nil || len(all) != 2 {
		t.Fatalf("ls --json = %v, %v", all, err)
	}
	var some []api.Sandbox
	if err := json.Unmarshal([]byte(mustCLI(t, srv, "ls", "--label", "team=x", "--json")), &some); err != nil || len(some) != 1 || some[0].ID != a.ID() {
		t.Fatalf("ls --label team=x --json = %v, %v", some, err)
	}
	table := strings.Split(strings.TrimSpace(mustCLI(t, srv, "ls")), "\n")
	if len(table) != 3 || strings.Join(strings.Fields(table[0]), " ") != "ID NAME TEMPLATE STATE CREATED LABELS" {
		t.Fatalf("ls table:\n%s", strings.Join(table, "\n"))
	}
	if f := strings.Fields(table[1]); f[0] != a.ID() || f[1] != "-" || f[2] != "busybox" || f[3] != "running" || f[len(f)-1] != "env=ci,team=x" {
		t.Fatalf("ls row = %q", table[1])
	}
	if out := mustCLI(t, srv, "ls", "--json", "--label", "team=none"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls with no match = %q, want []", out)
	}
	if _, errOut, code := cli(t, srv, "", "ls", "--label", "novalue"); code != exitAgentbox || !strings.Contains(errOut, "KEY=VALUE") {
		t.Fatalf("ls --label novalue: exit %d, %q", code, errOut)
	}
}

func TestCreateInspectRm(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	id := strings.TrimSpace(mustCLI(t, srv, "create", "--env", "A=1", "--label", "k=v", "--cpus", "0.5",
		"--memory", "512M", "--pids", "64", "--timeout", "10m"))
	sb := srv.Sandbox(id)
	if sb == nil {
		t.Fatalf("create printed %q, which is no sandbox", id)
	}
	info := sb.Info()
	if info.Env["A"] != "1" || info.Labels["k"] != "v" || info.Resources != (api.Resources{CPUs: 0.5, MemoryBytes: 512 << 20, PidsMax: 64}) || info.ExpiresAt == nil {
		t.Fatalf("created %+v", info)
	}
	var got []api.Sandbox
	if err := json.Unmarshal([]byte(mustCLI(t, srv, "inspect", id)), &got); err != nil || len(got) != 1 || got[0].ID != id {
		t.Fatalf("inspect = %v, %v", got, err)
	}
	var created api.Sandbox
	if err := json.Unmarshal([]byte(mustCLI(t, srv, "create", "--json")), &created); err != nil || created.State != api.StateRunning {
		t.Fatalf("create --json = %+v, %v", created, err)
	}

	out, errOut, code := cli(t, srv, "", "rm", id, "sb-missing")
	if code != exitAgentbox || strings.TrimSpace(out) != id || !regexpRequestID(errOut) || !strings.Contains(errOut, "sb-missing") {
		t.Fatalf("rm existing+missing: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if srv.Sandbox(id) != nil {
		t.Fatal("rm left the sandbox")
	}
	if _, _, code := cli(t, srv, "", "rm", "-f", "sb-missing"); code != 0 {
		t.Fatalf("rm -f of a missing sandbox: exit %d", code)
	}
	if _, errOut, code := cli(t, srv, "", "create", "--memory", "lots"); code != exitAgentbox || !strings.Contains(errOut, "--memory") {
		t.Fatalf("create --memory lots: exit %d, %q", code, errOut)
	}
}

// regexpRequestID reports whether s has the CLI's error form with a request id.
func regexpRequestID(s string) bool {
	return strings.HasPrefix(s, "agentbox: ") && strings.Contains(s, "(request id req-")
}

func TestExecExitCodes(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	id := srv.AddSandbox(api.CreateSandboxRequest{}).ID()

	out, errOut, code := cli(t, srv, "", "exec", id, "--", "sh", "-c", "echo hi; echoerr no; exit 7")
	if code != 7 || out != "hi\n" || errOut != "no\n" {
		t.Fatalf("exec exit 7: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Flags after the ID belong to the command, not to agentbox.
	if out, _, code := cli(t, srv, "", "exec", "--env", "X=y", "-w", "/tmp", id, "printenv", "X"); code != 0 || out != "y\n" {
		t.Fatalf("exec printenv: code %d, %q", code, out)
	}
	req := srv.Sandbox(id).Execs()[1]
	if req.Cwd != "/tmp" || strings.Join(req.Cmd, " ") != "printenv X" || req.StdinOpen || req.TTY != nil {
		t.Fatalf("exec request = %+v", req)
	}
	if _, _, code := cli(t, srv, "", "exec", id, "false"); code != 1 {
		t.Fatalf("exec false: code %d", code)
	}
	if _, errOut, code := cli(t, srv, "", "exec", "--timeout", "50ms", id, "sleep", "5"); code != 137 || !strings.Contains(errOut, "timed out") {
		t.Fatalf("exec past its timeout: code %d, %q", code, errOut)
	}
	_, errOut, code = cli(t, srv, "", "exec", "sb-missing", "true")
	if code != exitAgentbox || !regexpRequestID(errOut) || !strings.Contains(errOut, "not found") {
		t.Fatalf("exec in a missing sandbox: code %d, stderr %q", code, errOut)
	}

	// -i streams stdin; -t asks for a terminal (stdin here is no terminal,
	// so no raw mode, but the request carries a size).
	if out, _, code := cli(t, srv, "line one\nline two\n", "exec", "-i", "-t", id, "cat"); code != 0 || out != "line one\nline two\n" {
		t.Fatalf("exec -it cat: code %d, %q", code, out)
	}
	execs := srv.Sandbox(id).Execs()
	if last := execs[len(execs)-1]; !last.StdinOpen || last.TTY == nil || last.TTY.Rows == 0 {
		t.Fatalf("exec -it request = %+v", last)
	}
}

func TestDetachAttachPsKill(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	id := srv.AddSandbox(api.CreateSandboxRequest{}).ID()
	pid := strings.TrimSpace(mustCLI(t, srv, "exec", "-d", id, "sh", "-c", "echo early; sleep 30"))
	if _, err := strconv.Atoi(pid); err != nil {
		t.Fatalf("exec -d printed %q, not a pid", pid)
	}
	var procs []api.Process
	if err := json.Unmarshal([]byte(mustCLI(t, srv, "ps", "--json", id)), &procs); err != nil || len(procs) != 1 || !procs[0].Running {
		t.Fatalf("ps --json = %+v, %v", procs, err)
	}
	if table := mustCLI(t, srv, "ps", id); !strings.Contains(table, "running") || !strings.Contains(table, "sleep 30") {
		t.Fatalf("ps table:\n%s", table)
	}
	mustCLI(t, srv, "kill", id, pid, "SIGINT")
	out, _, code := cli(t, srv, "", "attach", id, pid)
	if out != "early\n" || code != 130 {
		t.Fatalf("attach after kill INT: code %d, stdout %q", code, out)
	}
	if sigs := srv.Sandbox(id).Signals(); len(sigs) != 1 || sigs[0] != "INT" {
		t.Fatalf("signals sent = %v", sigs)
	}
}

func TestRun(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	out, _, code := cli(t, srv, "", "run", "--rm", "--label", "by=run", "--", "sh", "-c", "echo ran; exit 4")
	if code != 4 || out != "ran\n" {
		t.Fatalf("run --rm: code %d, stdout %q", code, out)
	}
	if ids := srv.SandboxIDs(); len(ids) != 0 {
		t.Fatalf("run --rm left sandboxes %v", ids)
	}
	if _, _, code := cli(t, srv, "", "run", "true"); code != 0 {
		t.Fatalf("run true: code %d", code)
	}
	if ids := srv.SandboxIDs(); len(ids) != 1 {
		t.Fatalf("run without --rm kept %v, want one sandbox", ids)
	}
}

func TestRunEmbeddedFallback(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	t.Setenv(agentbox.EnvHost, "")
	os.Unsetenv(agentbox.EnvHost)
	oldHost, oldStart := defaultHost, startEmbedded
	t.Cleanup(func() { defaultHost, startEmbedded = oldHost, oldStart })
	defaultHost = "unix://" + filepath.Join(t.TempDir(), "absent.sock")

	stopped := false
	startEmbedded = func(ctx context.Context) (string, func(), error) {
		return srv.Host, func() { stopped = true }, nil
	}
	out, errOut, code := cli(t, nil, "", "run", "--", "echo", "embedded")
	if code != 0 || out != "embedded\n" || !strings.Contains(errOut, "starting an embedded one") {
		t.Fatalf("run with no daemon: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if !stopped || len(srv.SandboxIDs()) != 0 {
		t.Fatalf("embedded run: stopped=%v, sandboxes left %v", stopped, srv.SandboxIDs())
	}

	// An explicit --host is never replaced by an embedded daemon.
	_, errOut, code = cli(t, nil, "", "--host", defaultHost, "run", "true")
	if code != exitAgentbox || !strings.Contains(errOut, "is the daemon running") {
		t.Fatalf("run with an explicit unreachable host: code %d, %q", code, errOut)
	}
	startEmbedded = nil
	_, errOut, code = cli(t, nil, "", "run", "true")
	if code != exitAgentbox || !strings.Contains(errOut, "no embedded daemon") {
		t.Fatalf("run with no daemon and no embedded one: code %d, %q", code, errOut)
	}
}

func TestCp(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	sb := srv.AddSandbox(api.CreateSandboxRequest{})
	id := sb.ID()
	dir := t.TempDir()

	// Host file -> sandbox, into an existing directory.
	local := filepath.Join(dir, "hello.txt")
	os.WriteFile(local, []byte("hello"), 0o640)
	sb.Mkdir("/work")
	mustCLI(t, srv, "cp", local, id+":/work")
	if got, err := sb.ReadFile("/work/hello.txt"); err != nil || string(got) != "hello" {
		t.Fatalf("cp to sandbox: %q, %v", got, err)
	}
	if fi := sb.Info(); fi.ID != id {
		t.Fatal("sandbox changed identity")
	}

	// Sandbox file -> host, under a new name; and to stdout.
	sb.WriteFile("/etc/conf", []byte("k=v\n"), 0o600)
	back := filepath.Join(dir, "conf.copy")
	mustCLI(t, srv, "cp", id+":/etc/conf", back)
	if b, err := os.ReadFile(back); err != nil || string(b) != "k=v\n" {
		t.Fatalf("cp from sandbox: %q, %v", b, err)
	}
	if st, _ := os.Stat(back); st.Mode().Perm() != 0o600 {
		t.Errorf("copied file mode %v, want 0600", st.Mode().Perm())
	}
	if out := mustCLI(t, srv, "cp", id+":/etc/conf", "-"); out != "k=v\n" {
		t.Fatalf("cp to stdout = %q", out)
	}
	if _, _, code := cli(t, srv, "from stdin", "cp", "-", id+":/tmp/in"); code != 0 {
		t.Fatalf("cp from stdin: exit %d", code)
	}
	if got, _ := sb.ReadFile("/tmp/in"); string(got) != "from stdin" {
		t.Fatalf("cp from stdin wrote %q", got)
	}

	// Host directory -> sandbox -> host.
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "a"), []byte("A"), 0o644)
	os.WriteFile(filepath.Join(tree, "sub", "b"), []byte("B"), 0o755)
	mustCLI(t, srv, "cp", tree, id+":/work")
	if got, err := sb.ReadFile("/work/tree/sub/b"); err != nil || string(got) != "B" {
		t.Fatalf("cp dir to sandbox: %q, %v", got, err)
	}
	out := filepath.Join(dir, "out")
	mustCLI(t, srv, "cp", id+":/work/tree", out)
	if b, err := os.ReadFile(filepath.Join(out, "sub", "b")); err != nil || string(b) != "B" {
		t.Fatalf("cp dir from sandbox: %q, %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(out, "sub", "b")); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("mode after round trip: %v, %v", st, err)
	}

	if _, errOut, code := cli(t, srv, "", "cp", local, filepath.Join(dir, "x")); code != exitAgentbox || !strings.Contains(errOut, "exactly one") {
		t.Fatalf("cp host->host: exit %d, %q", code, errOut)
	}
	if _, errOut, code := cli(t, srv, "", "cp", id+":relative", dir); code != exitAgentbox || !strings.Contains(errOut, "absolute") {
		t.Fatalf("cp relative remote path: exit %d, %q", code, errOut)
	}
}

func TestExtractTarRejectsEscapes(t *testing.T) {
	for _, evil := range []string{"../escape", "a/../../escape", "/abs/escape"} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: evil, Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
		tw.Write([]byte("x"))
		tw.Close()
		base := t.TempDir()
		dir := filepath.Join(base, "d")
		os.Mkdir(dir, 0o755)
		err := extractTar(&buf, dir)
		if _, serr := os.Stat(filepath.Join(base, "escape")); serr == nil {
			t.Fatalf("entry %q was written outside the destination", evil)
		}
		if evil != "/abs/escape" && err == nil {
			t.Fatalf("entry %q accepted", evil)
		}
	}

	// A symlink pointing out, then a file through it.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	outside := t.TempDir()
	tw.WriteHeader(&tar.Header{Name: "link", Linkname: outside, Typeflag: tar.TypeSymlink})
	tw.WriteHeader(&tar.Header{Name: "link/pwned", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	if err := extractTar(&buf, t.TempDir()); err == nil {
		t.Fatal("write through an escaping symlink accepted")
	}
	if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
		t.Fatal("file written through a symlink outside the destination")
	}
}

func TestTemplateBuildProgress(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	spec := filepath.Join(t.TempDir(), "spec.json")
	os.WriteFile(spec, []byte(`{"base": "debootstrap:bookworm", "steps": [{"run": "apt-get install -y python3"}, {"env": {"A": "1"}}]}`), 0o644)
	out := mustCLI(t, srv, "template", "build", "py", "--file", spec)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		"[1/3] base debootstrap:bookworm",
		"[2/3] RUN apt-get install -y python3",
		"      output of step 2",
		"[3/3] ENV",
		"      output of step 3",
	}
	if len(lines) != 6 || strings.Join(lines[:5], "\n") != strings.Join(want, "\n") || !strings.HasPrefix(lines[5], "built template py (sha256:py) in ") {
		t.Fatalf("progress output:\n%s", out)
	}
	if strings.Contains(out, "\r") || strings.Contains(out, "\x1b") {
		t.Fatalf("terminal control sequences in non-TTY output: %q", out)
	}

	var ts []api.Template
	if err := json.Unmarshal([]byte(mustCLI(t, srv, "template", "ls", "--json")), &ts); err != nil || len(ts) != 3 {
		t.Fatalf("template ls --json = %+v, %v", ts, err)
	}
	if table := mustCLI(t, srv, "template", "ls"); !strings.Contains(table, "NAME") || !strings.Contains(table, "py") {
		t.Fatalf("template ls:\n%s", table)
	}

	os.WriteFile(spec, []byte(`{"base": "busybox", "steps": [{"run": "fail"}]}`), 0o644)
	_, errOut, code := cli(t, srv, "", "template", "build", "bad", "--file", spec)
	if code != exitAgentbox || !regexpRequestID(errOut) || !strings.Contains(errOut, "step 2 failed") {
		t.Fatalf("failing build: exit %d, stderr %q", code, errOut)
	}
}

func TestBuildProgressTTY(t *testing.T) {
	var buf bytes.Buffer
	p := newBuildProgress(&buf, true)
	p.event(api.BuildEvent{Type: api.BuildEventStep, Step: 1, Steps: 2, Message: "base"})
	p.event(api.BuildEvent{Type: api.BuildEventLog, Message: "downloading"})
	p.event(api.BuildEvent{Type: api.BuildEventStep, Step: 2, Steps: 2, Message: "RUN x", Cached: true})
	p.stop()
	s := buf.String()
	if !strings.Contains(s, "\r\x1b[K") || !strings.Contains(s, "downloading") ||
		!strings.Contains(s, "[1/2] base (") || !strings.Contains(s, "[2/2] RUN x (cached) (") || !strings.HasSuffix(s, "\n") {
		t.Fatalf("tty progress = %q", s)
	}
}

func TestVersion(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	out := mustCLI(t, srv, "version")
	if !strings.Contains(out, "Client: agentbox ") || !strings.Contains(out, "Daemon: agentbox fake-1.0") {
		t.Fatalf("version:\n%s", out)
	}
	out, _, code := cli(t, nil, "", "--host", "unix://"+filepath.Join(t.TempDir(), "no.sock"), "version")
	if code != 0 || !strings.Contains(out, "Daemon: not reachable") {
		t.Fatalf("version without daemon: exit %d\n%s", code, out)
	}
}

func TestParseHelpers(t *testing.T) {
	for in, want := range map[string]int64{"512M": 512 << 20, "1g": 1 << 30, "1.5GiB": 3 << 29, "64KiB": 64 << 10, "100": 100, "2MB": 2 << 20} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "M", "-1M", "12X", "1e400G"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) accepted", bad)
		}
	}
	for in, want := range map[string]cpArg{
		"sb-1:/a/b": {"sb-1", "/a/b"}, "./x:y": {"", "./x:y"}, "/abs:x": {"", "/abs:x"}, "-": {"", "-"}, "plain": {"", "plain"}, "dir/f:x": {"", "dir/f:x"},
	} {
		if got := parseCpArg(in); got != want {
			t.Errorf("parseCpArg(%q) = %+v, want %+v", in, got, want)
		}
	}
}

// A downloaded archive comes from inside a sandbox: a sparse entry (which
// would be written at its full logical size), an unknown type or a file
// larger than the disk are refused, and nothing is written.
func TestExtractTarRefusesHostile(t *testing.T) {
	x := []byte("x")
	one := func(e rawtar.Entry) []byte { var b rawtar.Builder; return b.Add(e).Bytes() }
	for name, b := range map[string][]byte{
		"pax sparse": rawtar.PAXSparse1("f", 2<<30, x),
		"old sparse": rawtar.OldGNUSparse("f", 2<<30, x),
		"unknown":    one(rawtar.Entry{Name: "f", Typeflag: 'Z'}),
		"1 PiB":      one(rawtar.Entry{Name: "f", Typeflag: '0', Size: 1 << 50, Data: x}),
	} {
		dir := t.TempDir()
		if err := extractTar(bytes.NewReader(b), dir); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s: wrote %v", name, ents)
		}
	}
}

// A downloaded directory the archive makes read-only stays writable by
// its owner (its entries are written into it), and modes are subject to
// the process's umask, as for any file the CLI creates.
func TestExtractTarModes(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "ro/", Mode: 0o555, Typeflag: tar.TypeDir})
	tw.WriteHeader(&tar.Header{Name: "ro/f", Mode: 0o4777, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	dir := t.TempDir()
	if err := extractTar(&buf, dir); err != nil {
		t.Fatal(err)
	}
	umask := os.FileMode(processUmask())
	for name, want := range map[string]os.FileMode{"ro": 0o755 &^ umask, "ro/f": 0o777 &^ umask} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode() & (os.ModePerm | os.ModeSetuid); got != want {
			t.Errorf("%s: mode %v, want %v", name, got, want)
		}
	}
}

// A sandbox's name works wherever its id does (the test server resolves
// names as the daemon does), and ls shows it.
func TestNamesWhereIDs(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	a := srv.AddSandbox(api.CreateSandboxRequest{Name: "web1"})
	if out := mustCLI(t, srv, "inspect", "web1"); !strings.Contains(out, a.ID()) {
		t.Fatalf("inspect web1 = %q", out)
	}
	table := strings.Split(strings.TrimSpace(mustCLI(t, srv, "ls")), "\n")
	if f := strings.Fields(table[1]); len(table) != 2 || f[0] != a.ID() || f[1] != "web1" {
		t.Fatalf("ls:\n%s", strings.Join(table, "\n"))
	}
	if out, errOut, code := cli(t, srv, "", "inspect", "nosuch"); code != exitAgentbox || out != "" || !strings.Contains(errOut, "nosuch") {
		t.Fatalf("inspect nosuch: exit %d, stdout %q, stderr %q; want nothing on stdout", code, out, errOut)
	}
	if out := mustCLI(t, srv, "rm", "web1"); strings.TrimSpace(out) != "web1" || srv.Sandbox(a.ID()) != nil {
		t.Fatalf("rm web1 = %q; left %v", out, srv.SandboxIDs())
	}
}
