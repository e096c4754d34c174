package config

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestDefaultsValidate(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if c.DataDir != "/var/lib/agentbox" || c.SocketPath != "/run/agentbox/agentbox.sock" || c.TCPAddr != "" {
		t.Fatalf("paths: %+v", c)
	}
	if c.DefaultTemplate != "busybox" || c.DefaultResources != (Resources{CPUs: 1, MemoryBytes: 1 << 30, PidsMax: 1024, DiskBytes: 10 << 30, DiskInodes: 512 << 10}) {
		t.Fatalf("template/resources: %+v", c)
	}
	// The id map comes from /etc/subuid when it has an agentbox entry.
	wantBase, wantSize := uint32(DefaultIDMapBase), uint32(DefaultIDMapSize)
	if s, n, ok := lookupSubIDFile("/etc/subuid", SubIDUser); ok {
		wantBase, wantSize = s, n
	}
	if c.UIDMapBase != wantBase || c.UIDMapSize != wantSize {
		t.Fatalf("uid map %d+%d, want %d+%d", c.UIDMapBase, c.UIDMapSize, wantBase, wantSize)
	}
}

// The default disk limit may be turned off or changed, and a ceiling set
// above it, but not below it or without one.
func TestValidateDiskDefaults(t *testing.T) {
	for _, tc := range []struct {
		name                string
		bytes, inodes       int64
		maxBytes, maxInodes int64
		ok                  bool
	}{
		{"default", DefaultDiskBytes, DefaultDiskInodes, 0, 0, true},
		{"off", 0, 0, 0, 0, true},
		{"smaller", 64 << 20, 4096, 0, 0, true},
		{"ceiling", DefaultDiskBytes, DefaultDiskInodes, 20 << 30, 1 << 20, true},
		{"ceiling below the default", DefaultDiskBytes, DefaultDiskInodes, 1 << 30, 0, false},
		{"inode ceiling below the default", DefaultDiskBytes, DefaultDiskInodes, 0, 1024, false},
		{"ceiling without a default", 0, 0, 20 << 30, 0, false},
		{"tiny", 1 << 20, 0, 0, 0, false},
		{"few inodes", DefaultDiskBytes, 10, 0, 0, false},
		{"negative", -1, 0, 0, 0, false},
		{"negative ceiling", DefaultDiskBytes, 0, -1, 0, false},
	} {
		c := Default()
		c.DefaultResources.DiskBytes, c.DefaultResources.DiskInodes = tc.bytes, tc.inodes
		c.MaxDiskBytes, c.MaxDiskInodes = tc.maxBytes, tc.maxInodes
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("%s: Validate() = %v; want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestApplyEnv(t *testing.T) {
	t.Setenv(EnvDataDir, "/srv/ab")
	t.Setenv(EnvSocket, "/tmp/ab.sock")
	t.Setenv(EnvTCP, "127.0.0.1:7777")
	t.Setenv(EnvAPIKeysFile, "/etc/ab/keys")
	t.Setenv(EnvLogLevel, "debug")
	t.Setenv(EnvLogFormat, "json")
	c := Default()
	c.ApplyEnv()
	if c.DataDir != "/srv/ab" || c.SocketPath != "/tmp/ab.sock" || c.TCPAddr != "127.0.0.1:7777" ||
		c.APIKeysFile != "/etc/ab/keys" || c.LogLevel != "debug" || c.LogFormat != "json" {
		t.Fatalf("env not applied: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateRejects(t *testing.T) {
	cases := map[string]func(*Config){
		"relative data dir":    func(c *Config) { c.DataDir = "var/lib" },
		"relative socket":      func(c *Config) { c.SocketPath = "x.sock" },
		"long socket":          func(c *Config) { c.SocketPath = "/" + strings.Repeat("a", 120) },
		"tcp bad addr":         func(c *Config) { c.TCPAddr = "nonsense"; c.APIKeysFile = "/k" },
		"uid range includes 0": func(c *Config) { c.UIDMapBase = 0 },
		"uid range system ids": func(c *Config) { c.UIDMapBase = 999 },
		"gid range system ids": func(c *Config) { c.GIDMapBase = 500 },
		"zero uid size":        func(c *Config) { c.UIDMapSize = 0 },
		"overflow":             func(c *Config) { c.UIDMapBase = 1<<32 - 10; c.UIDMapSize = 100 },
		"no template":          func(c *Config) { c.DefaultTemplate = "" },
		"zero memory":          func(c *Config) { c.DefaultResources.MemoryBytes = 0 },
		"bad level":            func(c *Config) { c.LogLevel = "loud" },
		"bad format":           func(c *Config) { c.LogFormat = "xml" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			c := Default()
			mutate(c)
			err := c.Validate()
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Validate = %v, want invalid argument", err)
			}
		})
	}
	// Several problems are all reported.
	c := Default()
	c.LogFormat, c.LogLevel = "xml", "loud"
	if err := c.Validate(); !strings.Contains(err.Error(), "xml") || !strings.Contains(err.Error(), "loud") {
		t.Fatalf("joined errors missing: %v", err)
	}
}

func TestParseSubID(t *testing.T) {
	in := "# comment\nroot:100000:65536\nbroken line\nagentbox:200000:131072\nagentbox:1:1\n"
	s, n, ok, err := ParseSubID(strings.NewReader(in), "agentbox")
	if err != nil || !ok || s != 200000 || n != 131072 {
		t.Fatalf("got %d %d %v %v", s, n, ok, err)
	}
	if _, _, ok, err := ParseSubID(strings.NewReader(in), "nobody"); ok || err != nil {
		t.Fatalf("missing user: ok=%v err=%v", ok, err)
	}
	for _, bad := range []string{"agentbox:x:1", "agentbox:1", "agentbox:5:0", "agentbox:4294967295:2"} {
		if _, _, _, err := ParseSubID(strings.NewReader(bad), "agentbox"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}

func TestAPIKeysAndRedaction(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "keys")
	secret := "s3cr3t-key-0123456789"
	if err := os.WriteFile(p, []byte("# keys\n\n"+secret+"\nanother-key-abcdefgh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	c.TCPAddr, c.APIKeysFile = "127.0.0.1:9", p
	if err := c.LoadAPIKeys(); err != nil {
		t.Fatal(err)
	}
	if len(c.APIKeys) != 2 || c.APIKeys[0] != secret {
		t.Fatalf("keys: %d", len(c.APIKeys))
	}
	r := c.Redacted()
	if strings.Contains(strings.Join(r.APIKeys, ","), secret) || len(r.APIKeys) != 2 {
		t.Fatalf("Redacted leaks: %v", r.APIKeys)
	}
	if c.APIKeys[0] != secret {
		t.Fatal("Redacted modified the original")
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", c)
	if strings.Contains(buf.String(), secret) || !strings.Contains(buf.String(), `"api_keys":2`) {
		t.Fatalf("log line: %s", buf.String())
	}

	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.LoadAPIKeys(); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("world-readable keys file: %v", err)
	}
	if _, err := ParseAPIKeys(strings.NewReader("short\n")); err == nil || strings.Contains(err.Error(), "short") {
		t.Fatalf("short key: %v", err)
	}
	if _, err := ParseAPIKeys(strings.NewReader("# nothing\n")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty keys: %v", err)
	}
}

// Two data dirs never share a derived cgroup parent; one data dir always
// gets the same one (a restarted daemon finds its sandboxes), however its
// path is spelled; an explicit parent wins.
func TestDerivedCgroupParent(t *testing.T) {
	a, b := DerivedCgroupParent("/var/lib/agentbox"), DerivedCgroupParent("/var/lib/agentbox2")
	if a == b {
		t.Errorf("two data dirs share the parent %s", a)
	}
	if a == LegacyCgroupParent || !strings.HasPrefix(a, LegacyCgroupParent+"-") || len(a) != len(LegacyCgroupParent)+13 {
		t.Errorf("derived parent %q: want %s-<12 hex digits>", a, LegacyCgroupParent)
	}
	if again := DerivedCgroupParent("/var/lib/agentbox/"); again != a {
		t.Errorf("same data dir, other spelling: %s, was %s", again, a)
	}
	c := Default()
	if got := c.EffectiveCgroupParent("/var/lib/agentbox"); got != a {
		t.Errorf("EffectiveCgroupParent = %s, want the derived %s", got, a)
	}
	c.CgroupParent = "mine"
	if got := c.EffectiveCgroupParent("/var/lib/agentbox"); got != "mine" {
		t.Errorf("EffectiveCgroupParent = %s, want the configured one", got)
	}
}
