package tunnel_test

// The feature on a real Manager and guest (sandboxtest, the in-process
// backend): a program's connection to a tunnelled port inside the sandbox
// reaches the daemon's handler, which learns the sandbox from the guest
// socket. The in-process guest listens on the host's loopback (no network
// namespace), so the port is a free one of this host and one sandbox runs.

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/tunnel"
)

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestInprocTunnel(t *testing.T) {
	port := freePort(t)
	tun := tunnel.New(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { tun.Close() })
	seen := make(chan string, 4)
	tun.HandlePort(port, func(ctx context.Context, sandboxID string, conn net.Conn) {
		defer conn.Close()
		line, _ := bufio.NewReader(conn).ReadString('\n')
		conn.Write([]byte(sandboxID + ":" + line))
		seen <- sandboxID
	})
	env := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) { c.Extensions = []sandbox.Extension{tun} })
	sb := env.Create(api.CreateSandboxRequest{})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var reply string
	for deadline := time.Now().Add(30 * time.Second); reply == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tunnelled port never answered")
		}
		c, err := net.DialTimeout("tcp4", addr, time.Second)
		if err != nil {
			continue // the keeper has not opened the tunnel yet
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte("hello\n"))
		reply, _ = bufio.NewReader(c).ReadString('\n')
		c.Close()
	}
	if reply != sb.ID+":hello\n" {
		t.Fatalf("reply %q", reply)
	}
	if id := <-seen; id != sb.ID {
		t.Fatalf("handler saw sandbox %q", id)
	}
	if err := env.M.DeleteSandbox(sandboxtest.Context(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp4", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("the port still accepts after the sandbox is deleted")
	}
}
