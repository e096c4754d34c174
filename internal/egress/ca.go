package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/renameio/v2"
)

// CA is one sandbox's interception certificate authority: an ECDSA P-256
// key and self-signed certificate, and the leaf certificates it minted
// (one per host, cached until close to expiry). Its certificate is
// installed into the sandbox's trust store; its key never leaves the host.
type CA struct {
	cert    *x509.Certificate
	certDER []byte
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey

	// mu guards leaves.
	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
	caFile       = "egress-ca.pem"
)

// LoadOrCreateCA reads the CA kept in dir (host-only) or creates and saves
// a new one there.
func LoadOrCreateCA(dir, name string) (*CA, error) {
	path := filepath.Join(dir, caFile)
	b, err := os.ReadFile(path)
	if err == nil {
		return parseCA(b)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading egress CA: %w", err)
	}
	ca, pemBytes, err := newCA(name)
	if err != nil {
		return nil, err
	}
	if err := renameio.WriteFile(path, pemBytes, 0o600); err != nil {
		return nil, fmt.Errorf("saving egress CA: %w", err)
	}
	return ca, nil
}

func newCA(name string) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"agentbox egress"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating egress CA: %w", err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	out = append(out, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})...)
	ca, err := parseCA(out)
	return ca, out, err
}

func parseCA(b []byte) (*CA, error) {
	ca := &CA{leaves: make(map[string]*tls.Certificate)}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		switch blk.Type {
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing egress CA: %w", err)
			}
			ca.cert, ca.certDER = c, blk.Bytes
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing egress CA key: %w", err)
			}
			ca.key = k
		}
	}
	if ca.cert == nil || ca.key == nil {
		return nil, fmt.Errorf("egress CA file lacks certificate or key")
	}
	lk, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca.leafKey = lk
	return ca, nil
}

// CertPEM is the CA certificate in PEM form, for the sandbox's trust store.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.certDER})
}

// Leaf returns a certificate for host signed by the CA.
func (ca *CA) Leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("minting certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.certDER}, PrivateKey: ca.leafKey, Leaf: leaf}
	ca.leaves[host] = c
	return c, nil
}
