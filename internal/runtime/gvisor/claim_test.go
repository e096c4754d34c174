package gvisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime/gvisor/gvinit"
	"github.com/agentbox/agentbox/internal/testutil"
)

// TestMoveSocketPlantedSymlink: a symlink to a host file planted where the
// guest's socket was is moved but never followed: the host file keeps its
// mode and owner, and what was moved is gone.
func TestMoveSocketPlantedSymlink(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(victim, 1234, 1234); err != nil {
		t.Fatal(err)
	}
	from, to := filepath.Join(dir, "guest.sock"), filepath.Join(dir, "claimed.sock")
	if err := os.Symlink(victim, from); err != nil {
		t.Fatal(err)
	}
	if err := moveSocket(from, to); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("moveSocket of a symlink: %v, want ErrPermissionDenied", err)
	}
	fi, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 || st.Gid != 1234 || fi.Mode().Perm() != 0o640 {
		t.Errorf("the symlink's target: mode %v owner %d:%d, was 0640 1234:1234", fi.Mode(), st.Uid, st.Gid)
	}
	if _, err := os.Lstat(to); !os.IsNotExist(err) {
		t.Errorf("what was moved is still there: %v", err)
	}
}

// TestClaimVerifiedImpostors: sockets of a sandbox process at the guest's
// names (owned by the sandbox's root, answering, bound again whenever
// removed) are claimed, fail the proof and are removed, maxClaims times;
// then the claim fails, ErrPermissionDenied, within its time, with nothing
// claimed left and the directory closed to the sandbox. The impostors
// never get more than a proof and a challenge of the host's.
func TestClaimVerifiedImpostors(t *testing.T) {
	testutil.RequiresRoot(t)
	root := t.TempDir()
	bdir := filepath.Join(root, "b")
	udir := filepath.Join(bdir, bundleSocket)
	if err := os.MkdirAll(udir, 0o700); err != nil {
		t.Fatal(err)
	}
	const owner = 54321
	if err := os.Chown(udir, owner, owner); err != nil {
		t.Fatal(err)
	}
	sockPath := filepath.Join(root, "sb.sock")
	var mu sync.Mutex
	var heard []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	impostor := func(name string) {
		defer wg.Done()
		p := filepath.Join(udir, name)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ln, err := net.Listen("unix", p)
			if err != nil { // there, or the directory closed
				time.Sleep(time.Millisecond)
				continue
			}
			ln.(*net.UnixListener).SetUnlinkOnClose(false)
			_ = os.Lchown(p, owner, owner)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						fmt.Fprintf(c, "%064x\n", 7)
						line, _ := bufio.NewReader(c).ReadString('\n')
						if line != "" {
							mu.Lock()
							heard = append(heard, line)
							mu.Unlock()
						}
						fmt.Fprintf(c, "%064x\n", 8)
					}()
				}
			}()
			// Bound again once the host took it away.
			for {
				if _, err := os.Lstat(p); err != nil {
					break
				}
				select {
				case <-stop:
					ln.Close()
					return
				case <-time.After(time.Millisecond):
				}
			}
			ln.Close()
		}
	}
	wg.Add(2)
	go impostor(gvinit.SocketName)
	go impostor(gvinit.CtlName)
	defer func() { close(stop); wg.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), rebindTimeout)
	defer cancel()
	start := time.Now()
	err := claimVerified(ctx, udir, sockPath, "the-nonce", owner, make(chan struct{}))
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("claiming impostors: %v, want ErrPermissionDenied", err)
	}
	if took := time.Since(start); took > rebindTimeout {
		t.Errorf("claiming impostors took %v", took)
	}
	for _, p := range []string{sockPath, filepath.Join(bdir, ctlSocket)} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is left after a failed claim: %v", p, err)
		}
	}
	fi, err := os.Stat(udir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || fi.Mode().Perm() != 0o555 {
		t.Errorf("socket dir after a failed claim: mode %v owner %d, want 0555 root's", fi.Mode(), st.Uid)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(heard) == 0 || len(heard) > 2*maxClaims {
		t.Errorf("the host asked impostors for %d proofs, want 1 to %d", len(heard), 2*maxClaims)
	}
	for _, l := range heard {
		if f := strings.Fields(l); len(f) != 3 || len(f[0]) != 64 || f[1]+" " != gvinit.ProveCommand || len(f[2]) != 64 {
			t.Errorf("the host told an impostor %q", l)
		}
	}
}
