package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// Sleeper starts a child process that sleeps (sleep 60) until t ends, when
// it is killed and reaped. It returns the process, which a test may kill
// earlier, and a channel closed once the process has exited and been
// reaped.
func Sleeper(t testing.TB) (*os.Process, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return cmd.Process, exited
}
