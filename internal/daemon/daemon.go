// Package daemon assembles the agentbox daemon from its parts: config,
// metadata store, isolation backend, layer and template stores, the sandbox
// manager and the HTTP API. Both `agentbox serve` and the embedded daemon of
// `agentbox run` use it, so the two can never behave differently.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/cleanup"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/idrange"
	"github.com/agentbox/agentbox/internal/layergc"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/metrics"
	"github.com/agentbox/agentbox/internal/ratelimit"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/runsecrets"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxevents"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
	"github.com/agentbox/agentbox/internal/sandboxnet"
	"github.com/agentbox/agentbox/internal/secrets"
	"github.com/agentbox/agentbox/internal/serviceurl"
	"github.com/agentbox/agentbox/internal/snapshot"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/templatesvc"
	"github.com/agentbox/agentbox/internal/tenant/registry"
	"github.com/agentbox/agentbox/internal/tunnel"
	"github.com/agentbox/agentbox/internal/upgrade"
	"github.com/agentbox/agentbox/internal/version"
	"github.com/agentbox/agentbox/internal/warmpool"
)

// Options are what the config file does not say.
type Options struct {
	// GuestBinary is the statically linked agentbox binary installed as the
	// sandboxes' runner; default: this process's executable.
	GuestBinary string
	Logger      *slog.Logger
	// Backends are backends built by the caller (tests: the in-process
	// one), run beside the built-in ones (backends.go); one of a built-in
	// backend's name replaces it. Config.Runtime may name any.
	Backends []runtime.Backend
}

// Daemon is a running agentbox daemon.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	store   *store.Bolt
	manager *sandbox.Manager
	// disks enforces sandboxes' disk limits (nil: unavailable; limits.go).
	disks   sandbox.DiskQuota
	handler http.Handler
	secrets *secrets.Store
	// backends are the isolation backends by name (backends.go).
	backends *runtime.Registry
	// stopBridge closes the API bridge.
	stopBridge func()
	// pipe is the execution pipeline and its triggers (pipeline.go).
	pipe *pipelineAPI
	// tenants is the tenant registry with its API (tenants.go).
	tenants *tenantAPI
	// pools are the warm pools, drained at Close.
	pools *warmpool.Keeper
	// gc runs layer collections after deletes (storage.go).
	gc *collector
	// svc is what both API listeners serve.
	svc service
	// runLock is held for the daemon's life (lockRunDir).
	runLock *os.File
	// metrics serves GET /metrics (internal/metrics).
	metrics http.Handler
	// closing is set when Close starts: /readyz answers 503 from then on.
	closing *atomic.Bool
	// services serves service URLs on both listeners.
	services *serviceurl.Exposures
	// codePort serves the code interpreter's port on the E2B listener.
	codePort *codePort

	// mu guards the fields below.
	mu        sync.Mutex
	listeners []net.Listener
	servers   []*http.Server
}

// New opens the data dir, re-adopts the sandboxes a previous daemon left
// running and returns a daemon ready to Serve. cfg must be validated.
//
// On error New undoes what it did (in reverse order: see package cleanup):
// the store and the socket-dir lock are released, the backend closed and
// the sandboxes dir's bind mount, when New made it, unmounted.
func New(ctx context.Context, cfg *config.Config, opts Options) (_ *Daemon, err error) {
	var undo cleanup.Stack
	defer undo.Clean()
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := checkRuntime(cfg, builtinBackends, opts.Backends); err != nil {
		return nil, err
	}
	// The range (uid and gid maps are one, Validate says) is cut into
	// 65536-id slots: slot 0 owns every layer and writable layer on disk,
	// each sandbox runs in a slot of its own.
	idRanges, err := idrange.New(cfg.UIDMapBase, cfg.UIDMapSize)
	if err != nil {
		return nil, fmt.Errorf("uid/gid map: %w", err)
	}
	ids := idRanges.Canonical()
	// 0700, also when an earlier version left it open: nothing below it
	// is for any host user but root (the guests never resolve a path in
	// it; native.Backend hands them their mounts).
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	realDataDir, err := filepath.EvalSymlinks(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	guestBin := opts.GuestBinary
	if guestBin == "" {
		if guestBin, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("locating the agentbox binary: %w", err)
		}
	}
	st, err := store.Open(filepath.Join(cfg.DataDir, "meta.db"), store.WithLogger(log))
	if err != nil {
		return nil, err
	}
	undo.Add(func() { st.Close() })
	// The data dir is this daemon's now (the store's lock); so must be the
	// directory of its sockets before anything there is swept.
	runLock, err := lockRunDir(filepath.Dir(cfg.SocketPath))
	if err != nil {
		return nil, err
	}
	undo.Add(func() { runLock.Close() })
	// Refused here rather than at the first create, where a cgo or
	// dynamically linked guest fails with an obscure setup error.
	if err := runner.CheckStatic(guestBin); err != nil {
		return nil, fmt.Errorf("guest binary %s: %w", guestBin, err)
	}
	runnerDir, err := runner.Install(filepath.Join(cfg.DataDir, "runner"), guestBin)
	if err != nil {
		return nil, err
	}
	unprotect, err := protectSandboxesDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	undo.Add(func() {
		if err := unprotect(); err != nil {
			log.Warn("unmounting the sandboxes dir", "err", err)
		}
	})
	dq, dqErr := setupDiskQuota(cfg.DataDir, log) // before any guest is spawned; see limits.go
	backends, err := newBackends(backendEnv{cfg: cfg, log: log, runnerDir: runnerDir, realDataDir: realDataDir, idRanges: idRanges, ids: ids}, builtinBackends, opts.Backends)
	if err != nil {
		return nil, err
	}
	undo.Add(func() { _ = backends.Close() })
	ls, err := layers.New(filepath.Join(cfg.DataDir, "layers"), ids, layerOptions(cfg, log)...)
	if err != nil {
		return nil, err
	}
	// Quota admission is part of the Manager from its construction: the
	// meters it reads are connected below, before recovery, the warm
	// pools and the scheduler can create anything.
	reg, err := registry.Open(ctx, st, log)
	if err != nil {
		return nil, err
	}
	// The features attached to the sandbox core are built first and
	// handed to it at construction (sandbox.Config.Extensions).
	sec, secStore, err := openSecrets(cfg, log)
	if err != nil {
		return nil, err
	}
	// The flight recorder (internal/audit) records what every other
	// feature and the core do; the bridge's events and the egress
	// proxy's decisions are handed to it.
	rec, err := openAudit(cfg, sec.Redactor, log)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		undo.Add(func() { _ = rec.Close() })
	}
	evCfg := sandboxevents.Config{Redactor: sec.Redactor, Logger: log}
	if rec != nil {
		evCfg.OnRecord = rec.Bridge
	}
	events := sandboxevents.New(evCfg)
	tun := tunnel.New(log)
	stopBridge, err := startBridge(cfg, tun, sec, events, log)
	if err != nil {
		return nil, err
	}
	undo.Add(stopBridge)
	// The metrics (internal/metrics) observe the core and the egress
	// proxy's decisions; the warm pools' sizes are read at scrape.
	var pools *warmpool.Keeper
	mx := metrics.New(metrics.Config{
		Pools:     func(ctx context.Context) ([]api.Pool, error) { return pools.Pools(ctx) },
		StorePath: st.Path(),
		Logger:    log,
	})
	runOf, onEgress := sec.ActiveRun, mx.Egress
	if rec != nil {
		runOf = func(ctx context.Context, id string) string {
			if run := sec.ActiveRun(ctx, id); run != "" {
				return run
			}
			return rec.LiveRun(ctx, id)
		}
		onEgress = func(r api.EgressRecord) {
			mx.Egress(r)
			rec.Egress(r)
		}
	}
	edge, err := setupEgress(cfg, runOf, runsecrets.TenantSecrets{Store: secStore}, onEgress, log)
	if err != nil {
		return nil, err
	}
	network := sandboxnet.New(sandboxnet.Config{Edge: edge, Tunnels: tun, Logger: log})
	snaps := snapshot.New(snapshot.Config{Layers: ls, Checkpoints: st, IDs: ids, Quotas: reg, Logger: log,
		MemoryDir: filepath.Join(cfg.DataDir, "memory"),
		Retention: snapshot.Retention{
			Keep:   cfg.ImplicitCheckpointsKeep,
			MaxAge: time.Duration(cfg.ImplicitCheckpointsMaxAgeSeconds) * time.Second,
		}})
	// Service URLs: exposures survive restarts in the store; the
	// gateway reaches sandboxes through the core (Provision).
	svcURLs, err := openServiceURLs(ctx, cfg, st, tun, log)
	if err != nil {
		return nil, err
	}
	codePort := newCodePort(log) // the E2B front door's port 49999; forgets deleted sandboxes
	var tmpl *templates.Manager  // built by the Manager (NewTemplates): the cycle of templates and sandboxes
	// The warm pools fill only when SetPools starts them, after recovery.
	pools = warmpool.New(warmpool.Config{DataDir: cfg.DataDir, Logger: log})
	mgr, err := sandbox.New(sandbox.Config{
		DataDir:         cfg.DataDir,
		RunDir:          filepath.Dir(cfg.SocketPath),
		RunnerDir:       runnerDir,
		IDs:             ids,
		IDRanges:        idRanges,
		Layers:          ls,
		DefaultTemplate: cfg.DefaultTemplate,
		DefaultResources: api.Resources{
			CPUs:        cfg.DefaultResources.CPUs,
			MemoryBytes: cfg.DefaultResources.MemoryBytes,
			PidsMax:     cfg.DefaultResources.PidsMax,
			DiskBytes:   cfg.DefaultResources.DiskBytes,
			DiskInodes:  cfg.DefaultResources.DiskInodes,
			OpenFiles:   cfg.DefaultResources.OpenFiles,
		},
		MaxDiskBytes:  cfg.MaxDiskBytes,
		MaxDiskInodes: cfg.MaxDiskInodes,
		DiskQuota:     dq,
		DiskQuotaErr:  dqErr,
		Version:       version.Version,
		Logger:        log,
		Quotas:        reg,
		// Secrets first: its stream wrapper is the outermost, so
		// redaction sees what every other wrapper passes on; its exec
		// environment wins over the network's. Tunnels before the
		// network, which refreshes them. Checkpoints after them: a
		// deleted sandbox's implicit checkpoints go after every other
		// feature forgot it. The warm pools' sandboxes get every other
		// extension's hooks when they are made.
		// Service URLs after them: a deleted sandbox's exposures go
		// with it, whatever order the others forget it in.
		// The metrics last: they observe what the others did. The flight
		// recorder, when on, comes before everything: its exec wrapper sees
		// the secrets' names before runsecrets clears them, and its stream
		// is the outermost, so it digests the output as redacted.
		Extensions: extensions(rec, sec, events, tun, network, snaps, svcURLs, codePort, pools, mx),
		NewTemplates: func(runner *sandbox.StepRunner) (_ sandbox.Templates, err error) {
			// Kept for the template service, built above the core below.
			tmpl, err = templates.New(templates.Config{
				DataDir: filepath.Join(cfg.DataDir, "templates"),
				Layers:  ls,
				IDs:     ids,
				Runner:  runner,
				Admit:   reg.AdmitTemplateLayer,
				Logger:  log,
			})
			if err != nil {
				return nil, err
			}
			return tmpl, nil
		},
	}, backends, nil, st)
	if err != nil {
		return nil, err
	}
	tmplSvc := templatesvc.New(templatesvc.Config{Templates: tmpl, Layers: ls, Sandboxes: mgr, Logger: log})
	layerGC := layergc.New(ls, mgr, st)
	upgrades := upgrade.New(upgrade.Config{RunnerDir: runnerDir, IDs: ids, IDRanges: idRanges, Version: version.Version, Sandboxes: mgr, Logger: log})
	pipe, err := newPipeline(cfg, mgr, network, snaps, st, log)
	if err != nil {
		return nil, err
	}
	tenants := connectTenants(reg, mgr, layerGC, pipe)
	// Everything a run needs is wired from here on: sandboxes, runs and
	// schedules may start.
	if err := mgr.Recover(ctx); err != nil {
		return nil, err
	}
	if err := svcURLs.Reconcile(ctx); err != nil {
		log.Warn("forgetting the exposures of deleted sandboxes", "err", err)
	}
	if err := prepareDisks(ctx, dq, cfg); err != nil {
		log.Warn("disks of the default limit are formatted at create", "err", err)
	}
	undo.Add(func() { _ = closeDisks(dq) })
	// Only now, with every recovered sandbox's id range taken, may
	// prespawned guests take ranges.
	backends.FillPools()
	collectAtStart(ctx, layerGC, log)
	if err := pools.SetPools(ctx, cfg.WarmPools); err != nil {
		return nil, err
	}
	if err := pipe.start(ctx); err != nil {
		return nil, err
	}
	gc := newCollector(layerGC, log)
	svc := service{mgr, sandboxfiles.New(mgr), sec, events, network, snaps, pools, tmplSvc, layerGC, upgrades, pipe, tenants, exposureAPI{svcURLs}, auditAPI{rec, events}, newReplay(rec, snaps, pipe, mgr, log), gc, st}
	// Ready from here on (recovery is done) until Close starts.
	closing := new(atomic.Bool)
	handler := httpapi.New(svc, httpapi.Options{
		Logger:   log,
		Version:  version.Version,
		Metrics:  mx.Handler(),
		Ready:    readiness(closing),
		MCP:      mcpserver.Handler(mcpService{svc}, log),
		Services: svcURLs,
		Console:  consoleHandler(cfg),
	})
	// After Recover: every fork protects its base. Manager.Close stops it.
	snaps.StartPruning(ctx)
	undo.Release()
	return &Daemon{cfg: cfg, backends: backends, log: log, store: st, manager: mgr, disks: dq, handler: handler, secrets: secStore, stopBridge: stopBridge, pipe: pipe, tenants: tenants, pools: pools, gc: gc, runLock: runLock, svc: svc, metrics: mx.Handler(), closing: closing, services: svcURLs, codePort: codePort}, nil
}

// Manager returns the sandbox manager (for the embedded daemon and tests).
func (d *Daemon) Manager() *sandbox.Manager { return d.manager }

// Start listens on the unix socket (and TCP when configured) and serves in
// the background; connections are accepted when it returns. Close stops
// serving.
func (d *Daemon) Start(ctx context.Context) error {
	ln, err := httpapi.ListenUnix(d.cfg.SocketPath)
	if err != nil {
		return err
	}
	d.serveOn(ln, d.handler)
	d.log.InfoContext(ctx, "agentbox daemon listening", "socket", d.cfg.SocketPath, "version", version.Version)
	if d.cfg.TCPAddr != "" {
		tln, err := listenTCP(ctx, &d.cfg.TCPEdge, d.cfg.TCPAddr, d.log)
		if err != nil {
			d.shutdown()
			return err
		}
		tcpHandler := httpapi.New(d.svc, httpapi.Options{
			Logger:       d.log,
			Version:      version.Version,
			APIKeys:      d.cfg.APIKeys,
			Tenants:      d.tenants.reg,
			RequireAuth:  true,
			AllowedHosts: d.cfg.AllowedHosts,
			RateLimit:    ratelimit.New(d.cfg.TCPRequestRate, d.cfg.TCPRequestBurst),
			Metrics:      d.metrics,
			Ready:        readiness(d.closing),
			MCP:          mcpserver.Handler(mcpService{d.svc}, d.log),
			Services:     d.services,
			Console:      consoleHandler(d.cfg),
		})
		d.serveOn(tln, tcpHandler)
		d.log.InfoContext(ctx, "agentbox daemon listening", "tcp", tln.Addr().String(), "tls", d.cfg.TLS())
	}
	if d.cfg.E2BAddr != "" {
		h, err := d.e2bHandler()
		if err != nil {
			d.shutdown()
			return err
		}
		eln, err := listenTCP(ctx, &d.cfg.TCPEdge, d.cfg.E2BAddr, d.log)
		if err != nil {
			d.shutdown()
			return err
		}
		d.serveOn(eln, h)
		d.log.InfoContext(ctx, "agentbox daemon serving the E2B API", "addr", eln.Addr().String(), "tls", d.cfg.TLS())
	}
	if d.cfg.MetricsAddr != "" {
		addr := d.cfg.MetricsListenAddr()
		mln, err := net.Listen("tcp", addr)
		if err != nil {
			d.shutdown()
			return fmt.Errorf("listening for metrics on %s: %w", addr, err)
		}
		d.serveOn(mln, httpapi.ProbeHandler(httpapi.Options{Metrics: d.metrics, Ready: readiness(d.closing)}))
		d.log.InfoContext(ctx, "agentbox daemon serving metrics", "addr", mln.Addr().String())
	}
	return nil
}

// readiness is GET /readyz's check: the daemon is ready from the end of
// New (recovery done, sandboxes can be created) until Close starts.
func readiness(closing *atomic.Bool) func(context.Context) error {
	return func(context.Context) error {
		if closing.Load() {
			return fmt.Errorf("the daemon is shutting down: %w", errdefs.ErrUnavailable)
		}
		return nil
	}
}

func (d *Daemon) serveOn(ln net.Listener, h http.Handler) {
	srv := httpapi.NewHTTPServer(h, d.log)
	d.mu.Lock()
	d.listeners = append(d.listeners, ln)
	d.servers = append(d.servers, srv)
	d.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("serving API", "addr", ln.Addr().String(), "err", err)
		}
	}()
}

func (d *Daemon) shutdown() {
	d.mu.Lock()
	servers := d.servers
	d.servers = nil
	d.mu.Unlock()
	socketOwned := len(servers) > 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(ctx); err != nil {
			_ = s.Close()
		}
	}
	if socketOwned {
		_ = os.Remove(d.cfg.SocketPath)
	}
}

// Close shuts down gracefully: listeners close, open streams end, the store
// is released. Sandboxes keep running for the next daemon to re-adopt.
func (d *Daemon) Close() error {
	d.closing.Store(true)
	d.shutdown()
	d.stopBridge()
	d.pipe.close()
	d.pools.DrainPools(context.Background())
	closeLimits(d.disks, d.cfg.DataDir, d.log)
	_ = d.manager.Close()
	if err := d.backends.Close(); err != nil {
		d.log.Warn("closing backends", "err", err)
	}
	err := d.store.Close()
	d.runLock.Close()
	return err
}

// service adapts the Manager and the execution pipeline to
// httpapi.Service: exec goes through the pipeline (pipeline.go); attach
// is the Manager's.
type service struct {
	*sandbox.Manager
	*sandboxfiles.Files     // file and guest process API
	*runsecrets.Secrets     // secrets API
	*sandboxevents.Recorder // sandbox events API
	*sandboxnet.Network     // network policy and egress log API
	*snapshot.Snapshots     // checkpoints, restore, fork, diff and merge API
	*warmpool.Keeper        // warm pools API
	*templatesvc.Templates  // template list, build, import, export and save API
	*layergc.Collector      // storage driver and garbage collection API
	*upgrade.Upgrades       // runner staging, listing and guest upgrade API
	*pipelineAPI
	*tenantAPI
	exposureAPI            // service URLs API (serviceurl)
	auditAPI               // events, export, follow and verify (internal/audit)
	replayAPI              // replay, compare and run reports (internal/replay)
	gc          *collector // background layer collections after deletes
	// records is the metadata store, whose quarantine of corrupt records
	// the admin API lists (admin.go).
	records store.Quarantiner
}

var (
	_ httpapi.Service           = service{}
	_ httpapi.SecretService     = service{} // runsecrets
	_ httpapi.EventService      = service{} // sandboxevents
	_ httpapi.AuditService      = service{} // audit
	_ httpapi.NetworkService    = service{} // sandboxnet
	_ httpapi.DiffService       = service{} // snapshot
	_ httpapi.MergeService      = service{} // snapshot
	_ httpapi.CheckpointService = service{} // snapshot
	_ httpapi.PoolService       = service{} // warmpool
	_ httpapi.ExposureService   = service{} // serviceurl
)
