package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Install installs the guest binary at src into a content-addressed,
// read-only runner directory under root (root/<sha256[:16]>/agentbox, mode
// 0555, owned by host root) and returns that directory. Sandboxes mount it
// read-only at /.agentbox; the binary is never the daemon's own executable
// file, so nothing inside a sandbox can reach the host binary through
// /proc/*/exe (CVE-2019-5736), and because it is owned by an id outside the
// sandbox's user namespace it could not be written even on a writable
// mount. Installing is atomic and idempotent: a second call for the same binary
// returns the same directory and changes nothing. The daemon installs its
// own guest binary so at start-up (sandbox.Config.RunnerDir).
func Install(root, src string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("installing runner: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("installing runner: hashing %s: %w", src, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(root, sum)
	if fi, err := os.Stat(filepath.Join(dir, "agentbox")); err == nil && fi.Mode().IsRegular() {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("installing runner: %w", err)
	}
	tmp, err := os.MkdirTemp(root, ".tmp-")
	if err != nil {
		return "", fmt.Errorf("installing runner: %w", err)
	}
	defer os.RemoveAll(tmp)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("installing runner: %w", err)
	}
	dst, err := os.OpenFile(filepath.Join(tmp, "agentbox"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return "", fmt.Errorf("installing runner: %w", err)
	}
	if _, err := io.Copy(dst, f); err != nil {
		dst.Close()
		return "", fmt.Errorf("installing runner: copying: %w", err)
	}
	if err := dst.Sync(); err != nil {
		dst.Close()
		return "", fmt.Errorf("installing runner: %w", err)
	}
	if err := dst.Close(); err != nil {
		return "", fmt.Errorf("installing runner: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("installing runner: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "agentbox")); serr == nil {
			return dir, nil // lost a race with another installer
		}
		return "", fmt.Errorf("installing runner: %w", err)
	}
	return dir, nil
}
