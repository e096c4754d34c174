package nsinit

import (
	"errors"
	"strings"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

func TestPolicyAssembles(t *testing.T) {
	p := Policy()
	insts, err := p.Assemble()
	if err != nil {
		t.Fatalf("Assemble: %v", err)
	}
	if len(insts) < len(deniedSyscalls) {
		t.Errorf("only %d instructions for %d denied syscalls", len(insts), len(deniedSyscalls))
	}
	if p.DefaultAction != seccomp.ActionAllow {
		t.Errorf("default action %v", p.DefaultAction)
	}
}

func TestReadSync(t *testing.T) {
	if err := ReadSync(strings.NewReader("ok")); err != nil {
		t.Errorf("ok: %v", err)
	}
	for in, want := range map[string]string{
		"":                          "exited before",
		`{"error":"mount failed"}`:  "mount failed",
		"garbage":                   "unreadable",
		`{"error":""}`:              "unreadable",
		strings.Repeat("x", 100000): "unreadable",
	} {
		err := ReadSync(strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ReadSync(%.20q) = %v, want %q", in, err, want)
		}
	}
}

func TestSyscallError(t *testing.T) {
	err := error(&SyscallError{Op: "mount", Source: "proc", Target: "proc", Flags: unix.MS_NOSUID, Err: unix.EPERM})
	if !errors.Is(err, unix.EPERM) {
		t.Error("does not unwrap to EPERM")
	}
	if got := err.Error(); got != "mount proc to proc (flags 0x2): operation not permitted" {
		t.Errorf("Error() = %q", got)
	}
}

func TestDefaultCapMask(t *testing.T) {
	// Docker's default bounding set without MKNOD and NET_RAW, as shown in CapBnd.
	if got := DefaultCapMask(); got != 0x00000000a00405fb {
		t.Errorf("DefaultCapMask = %#016x", got)
	}
}

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"hostname":"h","open_files":64}`))
	if err != nil || cfg.Hostname != "h" || cfg.OpenFiles != 64 {
		t.Fatalf("ParseConfig = %+v, %v", cfg, err)
	}
	for _, in := range []string{
		"",
		"{",
		`{"hostname":"h"} {}`,
		`{"layers":["/l"]}`, // the old host-path config is refused
		`{"hostname":"` + strings.Repeat("h", 65) + `"}`,
		strings.Repeat(" ", maxConfig+1),
	} {
		if _, err := ParseConfig([]byte(in)); err == nil {
			t.Errorf("ParseConfig(%.30q) succeeded", in)
		}
	}
}

// FuzzParseConfig: the config the guest reads comes from the host, but
// nothing in it may crash PID 1 or be accepted half-parsed.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"hostname":"h","open_files":64}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"hostname":"h"}{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := ParseConfig(b)
		if err == nil && (cfg == nil || len(cfg.Hostname) > 64) {
			t.Fatalf("accepted %q as %+v", b, cfg)
		}
	})
}
