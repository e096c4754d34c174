package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/errdefs"
)

var update = flag.Bool("update", false, "rewrite docs/CONFIG.md from the settings table")

// Every setting is bound once: no flag, variable or key is defined twice,
// and every row has a field whose type BindFlags and ApplyEnv handle.
func TestSettingsTable(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range settings {
		for _, name := range []string{"key " + s.Key, "flag " + s.Flag, "env " + s.Env} {
			if strings.HasSuffix(name, " ") {
				continue
			}
			if seen[name] {
				t.Errorf("%s defined twice", name)
			}
			seen[name] = true
		}
		if s.Flag == "" && s.Env == "" {
			t.Errorf("%s has neither a flag nor a variable", s.Key)
		}
		if s.Usage == "" {
			t.Errorf("%s has no help text", s.Key)
		}
	}
	c := Default()
	c.BindFlags(pflag.NewFlagSet("serve", pflag.ContinueOnError))
	for _, s := range settings {
		if s.Env != "" && s.Flag == "" {
			applyEnvValue(s.field(c), "1") // panics on a type it cannot parse
		}
	}
}

// A flag's default is the value before binding (defaults and environment),
// a flag given wins, and its help names the variable.
func TestBindFlags(t *testing.T) {
	t.Setenv(EnvLogLevel, "debug")
	t.Setenv(EnvEgressPermit, "10.0.0.0/8")
	c := Default()
	c.ApplyEnv()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	c.BindFlags(fs)
	if c.LogLevel != "debug" || !slices.Equal(c.EgressPermit, []string{"10.0.0.0/8"}) {
		t.Fatalf("binding changed the values: %q %q", c.LogLevel, c.EgressPermit)
	}
	if f := fs.Lookup("log-level"); f == nil || !strings.Contains(f.Usage, EnvLogLevel) {
		t.Fatalf("--log-level: %+v", f)
	}
	if err := fs.Parse([]string{"--log-level", "warn", "--prespawn", "0", "--warm-pool", "busybox=3", "--warm-pool", "busybox:gvisor=1", "--egress-permit", "192.168.1.0/24:443", "--insecure-tcp", "--default-disk-bytes", "1073741824"}); err != nil {
		t.Fatal(err)
	}
	if c.LogLevel != "warn" || c.Prespawn != 0 || c.WarmPools["busybox"] != 3 || c.WarmPools["busybox:gvisor"] != 1 || !c.InsecureTCP || c.DefaultResources.DiskBytes != 1<<30 ||
		!slices.Equal(c.EgressPermit, []string{"192.168.1.0/24:443"}) {
		t.Fatalf("flags not applied: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Every environment variable reaches its field, parsed as before the
// table existed.
func TestApplyEnvEverySetting(t *testing.T) {
	for name, v := range map[string]string{
		EnvConnectorsFile: "/etc/ab/connectors.json", EnvSecretsKeyFile: "/etc/ab/key",
		EnvEgressHostsFile: "/etc/ab/hosts", EnvEgressCAFile: "/etc/ab/ca.pem",
		EnvEgressPermit: " 10.0.0.1 ,, 172.16.0.0/12:* ", EnvStorageDriver: "copy",
		EnvMaxLayerDepth: "7", EnvCgroupParent: "mine", EnvWarmPools: "busybox=2, debian=1, debian:gvisor=3",
		EnvTLSCert: "/c.pem", EnvTLSKey: "/k.pem", EnvInsecureTCP: "TRUE", EnvPrespawn: "5",
	} {
		t.Setenv(name, v)
	}
	c := Default()
	c.ApplyEnv()
	if c.ConnectorsFile != "/etc/ab/connectors.json" || c.SecretsKeyFile != "/etc/ab/key" || c.EgressHostsFile != "/etc/ab/hosts" ||
		c.EgressCAFile != "/etc/ab/ca.pem" || c.StorageDriver != "copy" || c.MaxLayerDepth != 7 || c.CgroupParent != "mine" ||
		c.TLSCertFile != "/c.pem" || c.TLSKeyFile != "/k.pem" || !c.InsecureTCP || c.Prespawn != 5 {
		t.Fatalf("env not applied: %+v", c)
	}
	if !slices.Equal(c.EgressPermit, []string{"10.0.0.1", "172.16.0.0/12:*"}) {
		t.Fatalf("egress permit %q", c.EgressPermit)
	}
	if len(c.WarmPools) != 3 || c.WarmPools["busybox"] != 2 || c.WarmPools["debian"] != 1 || c.WarmPools["debian:gvisor"] != 3 {
		t.Fatalf("warm pools %v", c.WarmPools)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	rules, err := c.EgressPermitRules()
	if err != nil || len(rules) != 2 || rules[0].Prefix.String() != "10.0.0.1/32" || !rules[1].AnyPort {
		t.Fatalf("EgressPermitRules = %v, %v", rules, err)
	}
	// Malformed numbers are refused by Validate, not dropped.
	t.Setenv(EnvMaxLayerDepth, "deep")
	t.Setenv(EnvPrespawn, "many")
	t.Setenv(EnvWarmPools, "busybox=lots,busybox:Not_A_Backend=1,debian:=1")
	c = Default()
	c.ApplyEnv()
	err = c.Validate()
	for _, want := range []string{"max layer depth -1", "prespawn -1", `warm pool "busybox" size -1`,
		`warm pool "busybox:Not_A_Backend": runtime "Not_A_Backend" is not a backend name`, `warm pool "debian:": runtime "" is not a backend name`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want %q", err, want)
		}
	}
}

// What the daemon used to parse and check is refused by Validate.
func TestValidateDaemonChecks(t *testing.T) {
	cases := map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"uid and gid maps differ": {func(c *Config) { c.GIDMapBase = c.UIDMapBase + 65536 }, "must be the same range"},
		"bad egress permit":       {func(c *Config) { c.EgressPermit = []string{"example.com"} }, "egress permit"},
		"bad permit port":         {func(c *Config) { c.EgressPermit = []string{"10.0.0.0/8:99999"} }, "port is not valid"},
		"named tcp port":          {func(c *Config) { c.TCPAddr = "127.0.0.1:http" }, "must be host:port"},
		"negative prespawn":       {func(c *Config) { c.Prespawn = -1 }, "prespawn"},
		"huge prespawn":           {func(c *Config) { c.Prespawn = 1000 }, "prespawn"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := Default()
			tc.mutate(c)
			err := c.Validate()
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v; want invalid argument with %q", err, tc.want)
			}
		})
	}
	c := Default()
	c.TCPAddr = "127.0.0.1:7777"
	if port, ok := c.TCPPort(); !ok || port != 7777 {
		t.Fatalf("TCPPort = %d, %v", port, ok)
	}
	if c.Prespawn != DefaultPrespawn || DefaultPrespawn != 2 {
		t.Fatalf("prespawn default %d", c.Prespawn)
	}
}

// docs/CONFIG.md's table is the settings table.
func TestSettingsDoc(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "CONFIG.md")
	b, err := os.ReadFile(path)
	if err != nil && !*update {
		t.Fatal(err)
	}
	const begin, end = "<!-- settings: generated by go test ./internal/config -run TestSettingsDoc -update -->\n", "<!-- end of settings -->\n"
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the generated section markers", path)
	}
	want := doc[:i+len(begin)] + Markdown() + doc[j:]
	if want == doc {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is out of date: go test ./internal/config -run TestSettingsDoc -update", path)
}
