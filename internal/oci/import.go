package oci

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	digest "github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/untar"
)

// Non-distributable layer media types are deprecated for producers, but
// archives made before the deprecation still carry them; the import reads
// them like ordinary layers.
const (
	nonDistributableLayer     = "application/vnd.oci.image.layer.nondistributable.v1.tar"
	nonDistributableLayerGzip = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
)

// Result is an imported image.
type Result struct {
	Top    string            // ID of the top layer of the recreated chain
	Env    map[string]string // the image config's environment
	Layers int               // number of layers
}

// maxJSON bounds index, manifest and config documents.
const maxJSON = 4 << 20

// Media types of docker's image format, accepted on import.
const (
	dockerManifestV2   = "application/vnd.docker.distribution.manifest.v2+json"
	dockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	dockerLayerGzip    = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	dockerLayerForeign = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
)

// ImportArchive reads an image archive (the tar, optionally gzip'd, of an
// OCI image layout or of `docker save`) from r, spools it in the layer
// store's scratch space and imports it like ImportLayout.
func ImportArchive(ctx context.Context, ls *layers.Store, r io.Reader) (Result, error) {
	spool, err := ls.TempDir("import-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(spool)
	if err := unpack(ctx, r, spool); err != nil {
		return Result{}, fmt.Errorf("reading image archive: %w", err)
	}
	return ImportLayout(ctx, ls, spool)
}

// unpackReservePercent of the spool's filesystem (the daemon's data dir)
// stays free while an archive is unpacked.
const unpackReservePercent = 5

// unpack extracts the regular files, directories and symlinks of the tar
// stream r (gzip'd or not) under dir by the rules of package untar: names
// must stay inside dir, no entry is created through a symlink, and
// symlinks are kept as they are and only ever resolved beneath dir (see
// openBeneath). The archive's owners and modes are not kept (files 0600,
// directories 0700: nothing setuid lands in the daemon's data dir). PAX
// global headers are ignored; every other entry type (sparse files,
// links, devices, FIFOs, unknown) is refused with
// errdefs.ErrInvalidArgument, as nothing else belongs in an image
// archive. Before each entry the filesystem must have room for it,
// keeping unpackReservePercent free (errdefs.ErrResourceExhausted).
func unpack(ctx context.Context, r io.Reader, dir string) error {
	dirFd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dirFd)
	br := bufio.NewReader(r)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
		}
		defer gz.Close()
		src = gz
	}
	return untar.Extract(ctx, dirFd, src, untar.Options{ReservePercent: unpackReservePercent})
}

// openBeneath opens the file rel of the layout at root; symlinks may be
// followed, but never out of root.
func openBeneath(root, rel string) (*os.File, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("image file %s: %w", rel, errdefs.ErrNotFound)
		}
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("image file %s leaves the image: %w", rel, errdefs.ErrInvalidArgument)
		}
		return nil, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, rel)), nil
}

// layout is an image layout directory being imported.
type layout struct{ root string }

func (l layout) exists(rel string) bool {
	f, err := openBeneath(l.root, rel)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// readJSON decodes the (small) file rel; when want is set, its digest must
// match.
func (l layout) readJSON(rel string, want digest.Digest, v any) error {
	f, err := openBeneath(l.root, rel)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxJSON+1))
	if err != nil {
		return err
	}
	if len(data) > maxJSON {
		return fmt.Errorf("%s is larger than %d bytes: %w", rel, maxJSON, errdefs.ErrInvalidArgument)
	}
	if want != "" && digest.FromBytes(data) != want {
		return fmt.Errorf("%s does not match its digest %s: %w", rel, want, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decoding %s: %w: %w", rel, errdefs.ErrInvalidArgument, err)
	}
	return nil
}

func blobRel(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("digest %q: %w: %w", d, errdefs.ErrInvalidArgument, err)
	}
	return blobPath(d), nil
}

// ImportLayout recreates, in ls, the layers of the image in the directory
// dir: an OCI image layout (index.json; the manifest for linux and this
// machine's architecture, else the first one, is used) or an unpacked
// `docker save` archive (manifest.json; its first image). Blob digests
// and layer diff IDs are verified. Layers are gzip'd or plain tars.
func ImportLayout(ctx context.Context, ls *layers.Store, dir string) (Result, error) {
	l := layout{root: dir}
	var (
		cfgRel    string
		cfgDigest digest.Digest
		layerRels []string
		layerDigs []digest.Digest
	)
	switch {
	case l.exists(v1.ImageIndexFile):
		m, err := l.pickManifest(v1.ImageIndexFile, "", 0)
		if err != nil {
			return Result{}, err
		}
		if cfgRel, err = blobRel(m.Config.Digest); err != nil {
			return Result{}, err
		}
		cfgDigest = m.Config.Digest
		for _, d := range m.Layers {
			switch d.MediaType {
			case v1.MediaTypeImageLayer, v1.MediaTypeImageLayerGzip, dockerLayerGzip, dockerLayerForeign,
				nonDistributableLayer, nonDistributableLayerGzip:
			default:
				return Result{}, fmt.Errorf("layer media type %q is not supported (tar or tar+gzip): %w", d.MediaType, errdefs.ErrInvalidArgument)
			}
			rel, err := blobRel(d.Digest)
			if err != nil {
				return Result{}, err
			}
			layerRels, layerDigs = append(layerRels, rel), append(layerDigs, d.Digest)
		}
	case l.exists("manifest.json"):
		var dms []dockerManifest
		if err := l.readJSON("manifest.json", "", &dms); err != nil {
			return Result{}, err
		}
		if len(dms) == 0 {
			return Result{}, fmt.Errorf("manifest.json lists no image: %w", errdefs.ErrInvalidArgument)
		}
		cfgRel, layerRels = dms[0].Config, dms[0].Layers
		layerDigs = make([]digest.Digest, len(layerRels))
	default:
		return Result{}, fmt.Errorf("not an image: neither index.json nor manifest.json: %w", errdefs.ErrInvalidArgument)
	}
	var cfg v1.Image
	if err := l.readJSON(cfgRel, cfgDigest, &cfg); err != nil {
		return Result{}, fmt.Errorf("image config: %w", err)
	}
	if len(cfg.RootFS.DiffIDs) != 0 && len(cfg.RootFS.DiffIDs) != len(layerRels) {
		return Result{}, fmt.Errorf("config lists %d diff ids for %d layers: %w", len(cfg.RootFS.DiffIDs), len(layerRels), errdefs.ErrInvalidArgument)
	}
	if len(layerRels) == 0 {
		return Result{}, fmt.Errorf("image has no layers: %w", errdefs.ErrInvalidArgument)
	}
	res := Result{Env: map[string]string{}, Layers: len(layerRels)}
	for _, kv := range cfg.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			res.Env[k] = v
		}
	}
	for i, rel := range layerRels {
		var diffID digest.Digest
		if len(cfg.RootFS.DiffIDs) > 0 {
			diffID = cfg.RootFS.DiffIDs[i]
		}
		top, err := l.importLayer(ctx, ls, rel, layerDigs[i], diffID, res.Top)
		if err != nil {
			return Result{}, fmt.Errorf("importing layer %d of %d: %w", i+1, len(layerRels), err)
		}
		res.Top = top
	}
	return res, nil
}

// pickManifest reads the index at rel and returns the image manifest for
// linux/GOARCH (or the first), following nested indexes.
func (l layout) pickManifest(rel string, want digest.Digest, depth int) (v1.Manifest, error) {
	if depth > 4 {
		return v1.Manifest{}, fmt.Errorf("image indexes nested too deep: %w", errdefs.ErrInvalidArgument)
	}
	var idx v1.Index
	if err := l.readJSON(rel, want, &idx); err != nil {
		return v1.Manifest{}, err
	}
	var pick *v1.Descriptor
	for i, d := range idx.Manifests {
		if d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != goruntime.GOARCH) {
			continue
		}
		pick = &idx.Manifests[i]
		break
	}
	if pick == nil && len(idx.Manifests) > 0 {
		pick = &idx.Manifests[0]
	}
	if pick == nil {
		return v1.Manifest{}, fmt.Errorf("image index lists no manifest: %w", errdefs.ErrInvalidArgument)
	}
	brel, err := blobRel(pick.Digest)
	if err != nil {
		return v1.Manifest{}, err
	}
	switch pick.MediaType {
	case v1.MediaTypeImageIndex, dockerManifestList:
		return l.pickManifest(brel, pick.Digest, depth+1)
	case v1.MediaTypeImageManifest, dockerManifestV2:
	default:
		return v1.Manifest{}, fmt.Errorf("manifest media type %q is not supported: %w", pick.MediaType, errdefs.ErrInvalidArgument)
	}
	var m v1.Manifest
	if err := l.readJSON(brel, pick.Digest, &m); err != nil {
		return v1.Manifest{}, err
	}
	return m, nil
}

// importLayer imports one layer tar (gzip'd or not) on top of parent,
// checking the blob digest (when known) and the diff id (when known).
func (l layout) importLayer(ctx context.Context, ls *layers.Store, rel string, blobDigest, diffID digest.Digest, parent string) (string, error) {
	f, err := openBeneath(l.root, rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	blobV := digest.Canonical.Digester()
	br := bufio.NewReader(io.TeeReader(f, blobV.Hash()))
	var tarStream io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return "", fmt.Errorf("%s: %w: %w", rel, errdefs.ErrInvalidArgument, err)
		}
		defer gz.Close()
		tarStream = gz
	}
	diffV := digest.Canonical.Digester()
	tee := io.TeeReader(tarStream, diffV.Hash())
	layer, err := ls.ImportTar(ctx, tee, layers.CreateOptions{Parent: parent})
	if err != nil {
		return "", err
	}
	// The tar reader stops at the end marker: digest the rest too.
	_, derr := io.Copy(io.Discard, tee)
	_, berr := io.Copy(io.Discard, br)
	var bad error
	switch {
	case derr != nil || berr != nil:
		bad = fmt.Errorf("%s: %w: %w", rel, errdefs.ErrInvalidArgument, errors.Join(derr, berr))
	case blobDigest != "" && blobDigest.Algorithm() == digest.Canonical && blobV.Digest() != blobDigest:
		bad = fmt.Errorf("%s does not match its digest: %w", rel, errdefs.ErrInvalidArgument)
	case diffID != "" && diffID.Algorithm() == digest.Canonical && diffV.Digest() != diffID:
		bad = fmt.Errorf("%s does not match its diff id %s: %w", rel, diffID, errdefs.ErrInvalidArgument)
	}
	if bad != nil {
		// Not removed here: an identical layer may have existed and be in
		// use; the collector removes it when nothing uses it.
		return "", bad
	}
	return layer.ID, nil
}
