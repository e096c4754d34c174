package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// The storage format (docs/AUDIT.md).
//
// A sandbox's record is a directory <dir>/<sandbox id>/ holding
//
//	log.jsonl    one record per line, appended, never rewritten:
//	             {"seq":N,"prev":"<hex>","hash":"<hex>","event":{...}}
//	heads.jsonl  signed heads of the chain, appended:
//	             {"seq":N,"hash":"<hex>","time":"...","sig":"<base64>"}
//	owner        the tenant owning the sandbox (access to a deleted
//	             sandbox's record)
//	deleted      present once the sandbox is deleted: the time it was
//
// hash is SHA-256 over recordDomain, the sandbox id, the sequence number,
// the previous record's hash (zeroHash for the first) and the event's JSON
// exactly as stored (the bytes between "event": and the closing brace): an
// edit of any byte of the event, a deleted or a reordered record breaks
// the chain. A head's signature is ed25519 over headDomain, the sandbox
// id, the sequence number, the hash and the time; the last signed head
// catches a truncated tail.

const (
	recordDomain = "agentbox-audit-record-v1"
	headDomain   = "agentbox-audit-head-v1"
)

// zeroHash is the prev of a chain's first record.
var zeroHash = hex.EncodeToString(make([]byte, sha256.Size))

// record is one line of log.jsonl.
type record struct {
	Seq   uint64          `json:"seq"`
	Prev  string          `json:"prev"`
	Hash  string          `json:"hash"`
	Event json.RawMessage `json:"event"`
}

// head is one line of heads.jsonl.
type head struct {
	Seq  uint64    `json:"seq"`
	Hash string    `json:"hash"`
	Time time.Time `json:"time"`
	Sig  string    `json:"sig"`
}

// recordHash computes a record's hash (hex).
func recordHash(sandboxID string, seq uint64, prev string, event []byte) string {
	h := sha256.New()
	h.Write([]byte(recordDomain))
	h.Write([]byte{0})
	h.Write([]byte(sandboxID))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatUint(seq, 10)))
	h.Write([]byte{0})
	h.Write([]byte(prev))
	h.Write([]byte{0})
	h.Write(event)
	return hex.EncodeToString(h.Sum(nil))
}

// encodeRecord returns the line of a record, newline included. event is
// compact JSON without a newline (encoding/json's output).
func encodeRecord(sandboxID string, seq uint64, prev string, event []byte) (line []byte, hash string) {
	hash = recordHash(sandboxID, seq, prev, event)
	var b bytes.Buffer
	b.Grow(len(event) + 180)
	b.WriteString(`{"seq":`)
	b.WriteString(strconv.FormatUint(seq, 10))
	b.WriteString(`,"prev":"`)
	b.WriteString(prev)
	b.WriteString(`","hash":"`)
	b.WriteString(hash)
	b.WriteString(`","event":`)
	b.Write(event)
	b.WriteString("}\n")
	return b.Bytes(), hash
}

// maxLine bounds a record's line when reading (the recorder bounds what
// it writes far below).
const maxLine = 1 << 20

// decodeRecord parses one line of log.jsonl (without its newline) and
// checks it is well formed: known fields only, hex hashes, a JSON object
// as event. It does not check the chain (see Verify).
func decodeRecord(line []byte) (record, error) {
	var r record
	if len(line) > maxLine {
		return r, fmt.Errorf("record longer than %d bytes: %w", maxLine, errdefs.ErrInvalidArgument)
	}
	if r, ok := decodeWritten(line); ok {
		return r, nil
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("decoding record: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if dec.More() {
		return r, fmt.Errorf("decoding record: trailing data: %w", errdefs.ErrInvalidArgument)
	}
	if !validHash(r.Prev) || !validHash(r.Hash) {
		return r, fmt.Errorf("record %d: malformed hash: %w", r.Seq, errdefs.ErrInvalidArgument)
	}
	if len(r.Event) == 0 || r.Event[0] != '{' {
		return r, fmt.Errorf("record %d: event is not an object: %w", r.Seq, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// decodeWritten decodes a line exactly as encodeRecord writes it, without
// the JSON decoder (verifying 100,000 records is mostly this); any other
// shape is left to the decoder.
func decodeWritten(line []byte) (record, bool) {
	var r record
	rest, ok := bytes.CutPrefix(line, []byte(`{"seq":`))
	if !ok {
		return r, false
	}
	n := 0
	for n < len(rest) && n < 20 && '0' <= rest[n] && rest[n] <= '9' {
		n++
	}
	if n == 0 || (n > 1 && rest[0] == '0') {
		return r, false
	}
	seq, err := strconv.ParseUint(string(rest[:n]), 10, 64)
	if err != nil {
		return r, false
	}
	rest = rest[n:]
	const hexLen = 2 * sha256.Size
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"prev":"`)); !ok || len(rest) < hexLen {
		return r, false
	}
	prev := string(rest[:hexLen])
	if rest, ok = bytes.CutPrefix(rest[hexLen:], []byte(`","hash":"`)); !ok || len(rest) < hexLen {
		return r, false
	}
	hash := string(rest[:hexLen])
	if rest, ok = bytes.CutPrefix(rest[hexLen:], []byte(`","event":`)); !ok {
		return r, false
	}
	if len(rest) < 3 || rest[0] != '{' || rest[len(rest)-1] != '}' || rest[len(rest)-2] != '}' || !validHash(prev) || !validHash(hash) {
		return r, false
	}
	event := rest[:len(rest)-1]
	if !json.Valid(event) {
		return r, false
	}
	return record{Seq: seq, Prev: prev, Hash: hash, Event: event}, true
}

func validHash(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// headMessage is what a head's signature covers.
func headMessage(sandboxID string, seq uint64, hash string, t time.Time) []byte {
	return fmt.Appendf(nil, "%s\x00%s\x00%d\x00%s\x00%s", headDomain, sandboxID, seq, hash, t.UTC().Format(time.RFC3339Nano))
}

// signHead returns the signed head of a chain at seq, hash.
func signHead(key ed25519.PrivateKey, sandboxID string, seq uint64, hash string, t time.Time) head {
	t = t.UTC()
	sig := ed25519.Sign(key, headMessage(sandboxID, seq, hash, t))
	return head{Seq: seq, Hash: hash, Time: t, Sig: base64.StdEncoding.EncodeToString(sig)}
}

// verifyHead checks h's signature.
func verifyHead(pub ed25519.PublicKey, sandboxID string, h head) bool {
	sig, err := base64.StdEncoding.DecodeString(h.Sig)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return false
	}
	return ed25519.Verify(pub, headMessage(sandboxID, h.Seq, h.Hash, h.Time), sig)
}
