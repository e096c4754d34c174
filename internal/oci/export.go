// Package oci converts layer chains of the layer store to and from OCI
// images: export writes an OCI image archive (a tar of an OCI image layout:
// oci-layout, index.json, blobs/sha256/... with a manifest, a config and
// gzip'd layer tars; plus a docker-style manifest.json so `docker load`
// accepts it too); import reads an OCI image archive, an OCI layout
// directory or a `docker save` archive and recreates its layers.
//
// Layer content is translated by layers.Store.ExportTar and ImportTar
// (overlay whiteouts <-> OCI ".wh." entries, ownership shifted between host
// and sandbox ids), so an export followed by an import recreates layers of
// the same digests: the same tree hash, the same chain ID.
package oci

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/agentbox/agentbox/internal/layers"
)

// Image is what an exported image carries besides its layers.
type Image struct {
	// Name is the image's reference name (index annotation
	// org.opencontainers.image.ref.name, and NAME:latest in manifest.json).
	Name    string
	Env     map[string]string
	Created time.Time
}

// dockerManifest is one entry of a `docker save` manifest.json.
type dockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

// Export writes the OCI image archive of the chain of layer top (bottom
// layer first) to a spool directory in the layer store's scratch space and
// returns a reader of the archive. Everything that can fail is done before
// Export returns; Close removes the spool.
func Export(ctx context.Context, ls *layers.Store, top string, img Image) (io.ReadCloser, error) {
	chain, err := ls.Chain(top)
	if err != nil {
		return nil, fmt.Errorf("exporting image: %w", err)
	}
	spool, err := ls.TempDir("export-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(spool)
		}
	}()
	blobs := filepath.Join(spool, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o700); err != nil {
		return nil, err
	}
	var (
		layerDescs []v1.Descriptor
		diffIDs    []digest.Digest
	)
	for i := len(chain) - 1; i >= 0; i-- {
		desc, diffID, err := writeLayerBlob(ctx, ls, chain[i].ID, blobs)
		if err != nil {
			return nil, fmt.Errorf("exporting layer %s: %w", chain[i].ID, err)
		}
		layerDescs = append(layerDescs, desc)
		diffIDs = append(diffIDs, diffID)
	}
	created := img.Created.UTC()
	var env []string
	for _, k := range slices.Sorted(maps.Keys(img.Env)) {
		env = append(env, k+"="+img.Env[k])
	}
	config := v1.Image{
		Created:  &created,
		Platform: v1.Platform{Architecture: goruntime.GOARCH, OS: "linux"},
		Config:   v1.ImageConfig{Env: env},
		RootFS:   v1.RootFS{Type: "layers", DiffIDs: diffIDs},
		History:  []v1.History{{Created: &created, CreatedBy: "agentbox export", Comment: "layer chain " + top}},
	}
	configDesc, err := writeJSONBlob(blobs, v1.MediaTypeImageConfig, config)
	if err != nil {
		return nil, err
	}
	manifest := v1.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    layerDescs,
	}
	manifestDesc, err := writeJSONBlob(blobs, v1.MediaTypeImageManifest, manifest)
	if err != nil {
		return nil, err
	}
	manifestDesc.Platform = &config.Platform
	if img.Name != "" {
		manifestDesc.Annotations = map[string]string{v1.AnnotationRefName: img.Name}
	}
	index := v1.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageIndex,
		Manifests: []v1.Descriptor{manifestDesc},
	}
	if err := writeJSONFile(filepath.Join(spool, v1.ImageIndexFile), index); err != nil {
		return nil, err
	}
	if err := writeJSONFile(filepath.Join(spool, v1.ImageLayoutFile), v1.ImageLayout{Version: v1.ImageLayoutVersion}); err != nil {
		return nil, err
	}
	dm := dockerManifest{Config: blobPath(configDesc.Digest)}
	if img.Name != "" {
		dm.RepoTags = []string{img.Name + ":latest"}
	}
	for _, d := range layerDescs {
		dm.Layers = append(dm.Layers, blobPath(d.Digest))
	}
	if err := writeJSONFile(filepath.Join(spool, "manifest.json"), []dockerManifest{dm}); err != nil {
		return nil, err
	}
	ok = true
	return archive(spool), nil
}

func blobPath(d digest.Digest) string {
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded()
}

// writeLayerBlob writes layer id as a gzip'd tar blob into dir.
func writeLayerBlob(ctx context.Context, ls *layers.Store, id, dir string) (v1.Descriptor, digest.Digest, error) {
	f, err := os.CreateTemp(dir, ".layer-")
	if err != nil {
		return v1.Descriptor{}, "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	blob := digest.Canonical.Digester()
	counter := &countWriter{}
	gz, err := gzip.NewWriterLevel(io.MultiWriter(f, blob.Hash(), counter), gzip.BestSpeed)
	if err != nil {
		return v1.Descriptor{}, "", err
	}
	diff := digest.Canonical.Digester()
	if err := ls.ExportTar(ctx, id, io.MultiWriter(gz, diff.Hash())); err != nil {
		return v1.Descriptor{}, "", err
	}
	if err := gz.Close(); err != nil {
		return v1.Descriptor{}, "", err
	}
	if err := f.Close(); err != nil {
		return v1.Descriptor{}, "", err
	}
	d := blob.Digest()
	if err := os.Rename(f.Name(), filepath.Join(dir, d.Encoded())); err != nil {
		return v1.Descriptor{}, "", err
	}
	return v1.Descriptor{MediaType: v1.MediaTypeImageLayerGzip, Digest: d, Size: counter.n}, diff.Digest(), nil
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func writeJSONBlob(dir, mediaType string, v any) (v1.Descriptor, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return v1.Descriptor{}, err
	}
	d := digest.FromBytes(data)
	if err := os.WriteFile(filepath.Join(dir, d.Encoded()), data, 0o600); err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}, nil
}

func writeJSONFile(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// archive streams the directory spool as a tar (regular files and
// directories, sorted) and removes spool when closed.
func archive(spool string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := filepath.WalkDir(spool, func(path string, d os.DirEntry, err error) error {
			if err != nil || path == spool {
				return err
			}
			rel, err := filepath.Rel(spool, path)
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: fi.ModTime(), Mode: 0o644, Typeflag: tar.TypeReg, Size: fi.Size()}
			if d.IsDir() {
				hdr.Name, hdr.Mode, hdr.Typeflag, hdr.Size = hdr.Name+"/", 0o755, tar.TypeDir, 0
				return tw.WriteHeader(hdr)
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return &spoolReader{PipeReader: pr, spool: spool}
}

type spoolReader struct {
	*io.PipeReader
	spool string
}

func (s *spoolReader) Close() error {
	err := s.PipeReader.CloseWithError(errors.New("archive reader closed"))
	return errors.Join(err, os.RemoveAll(s.spool))
}
