package gvinit

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
)

// Authentication on the guest's sockets after a rebind, and on every
// control connection.
//
// While the host has the socket directory open for the guest to bind again
// (after a memory checkpoint, or in a restored sandbox), every process of
// the sandbox can reach it: it may connect to the guest's new sockets from
// inside the sentry, or bind sockets of its own there. So the nonce of the
// last quiesce (known only to the host and to the guest, a non-dumpable
// PID 1) is never sent; each side proves it knows it by a MAC over a
// challenge of the other side:
//
//  1. The guest writes a fresh challenge (Challenge) and a newline.
//  2. The peer answers HostProof(nonce, that challenge), a space, and its
//     command, and a newline. A control connection's command is
//     QuiescePrefix + new nonce, or "prove " + a challenge of the host's;
//     a guest socket connection's (before the guest serves anything after
//     a rebind) is "prove " + a challenge.
//  3. The guest answers a proof with GuestProof(nonce, the host's
//     challenge) and a newline, and a quiesce with QuiesceReply; anything
//     else is closed unanswered.
//
// Before the first quiesce the nonce is empty: the control socket is then
// reachable by the host alone (claimed before any user process ran).

// Challenge returns a fresh challenge.
func Challenge() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func mac(nonce, role, challenge string) string {
	m := hmac.New(sha256.New, []byte("agentbox-gvinit:"+nonce))
	m.Write([]byte(role + ":" + challenge))
	return hex.EncodeToString(m.Sum(nil))
}

// HostProof is the host's answer to the guest's challenge.
func HostProof(nonce, challenge string) string { return mac(nonce, "host", challenge) }

// GuestProof is the guest's answer to the host's challenge.
func GuestProof(nonce, challenge string) string { return mac(nonce, "guest", challenge) }

// ProveCommand is the command asking the guest for its proof.
const ProveCommand = "prove "

// authenticate runs the guest's side of steps 1 and 2 on c and returns the
// peer's command; an error when the peer did not prove itself.
func authenticate(rw io.ReadWriter, br *bufio.Reader, nonce string) (string, error) {
	ch := Challenge()
	if _, err := io.WriteString(rw, ch+"\n"); err != nil {
		return "", err
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	proof, cmd, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	if !ok || !hmac.Equal([]byte(proof), []byte(HostProof(nonce, ch))) {
		return "", errors.New("the peer did not prove itself the host")
	}
	return cmd, nil
}
