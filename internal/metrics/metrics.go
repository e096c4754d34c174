// Package metrics is the daemon's Prometheus metrics feature: an extension
// of the sandbox core (sandbox.Observer and sandbox.ExecWrapper) that counts
// and times what the core does, plus collectors read at scrape time
// (sandboxes by state, warm pools, store size, the Go runtime and the
// process). See docs/METRICS.md for every metric.
//
// Labels are bounded: no sandbox id, tenant, name or command is ever a
// label value, only the core's fixed vocabularies (states, backends,
// operation kinds, outcomes, event types, egress decisions) and the
// templates of the warm pools the admin configured.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Config is what the metrics read at scrape time. Every field is optional:
// a nil source leaves its metric out.
type Config struct {
	// Pools lists the warm pools.
	Pools func(ctx context.Context) ([]api.Pool, error)
	// StorePath is the metadata store's file; its size is agentbox_store_bytes.
	StorePath string
	// Logger receives scrape errors; nil discards them.
	Logger *slog.Logger
}

// Metrics is the metrics extension. Its methods are safe for concurrent use.
type Metrics struct {
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry
	// core lists the sandboxes at scrape (agentbox_sandboxes is computed
	// from the core's list, so it is right after a daemon restart); set
	// once by Provision, before any scrape can happen.
	core sandboxLister

	operations    *prometheus.CounterVec
	createSeconds *prometheus.HistogramVec
	opSeconds     map[string]*prometheus.HistogramVec // by Op.Kind: checkpoint, restore, fork
	execs         *prometheus.CounterVec
	execSeconds   *prometheus.HistogramVec
	egress        *prometheus.CounterVec
	limitEvents   *prometheus.CounterVec
	transitions   *prometheus.CounterVec
}

var (
	_ sandbox.Extension   = (*Metrics)(nil)
	_ sandbox.Observer    = (*Metrics)(nil)
	_ sandbox.ExecWrapper = (*Metrics)(nil)
	_ sandbox.Provisioner = (*Metrics)(nil)
)

// sandboxLister is the part of the core the sandboxes gauge reads
// (*sandbox.Manager).
type sandboxLister interface {
	ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
}

// Provision implements sandbox.Provisioner: the sandboxes gauge reads the
// core's list of sandboxes (every tenant's). A core without one leaves the
// gauge out.
func (m *Metrics) Provision(c sandbox.Core) error {
	if l, ok := c.(sandboxLister); ok {
		m.core = l
	}
	return nil
}

// Outcomes (label "outcome").
const (
	OutcomeOK         = "ok"          // operation succeeded; exec exited 0
	OutcomeError      = "error"       // operation failed; exec ended with an error event
	OutcomeNonzero    = "nonzero"     // exec exited with a non-zero code
	OutcomeSignal     = "signal"      // exec was killed by a signal
	OutcomeTimeout    = "timeout"     // exec hit its timeout
	OutcomeOOM        = "oom"         // exec was OOM-killed
	OutcomeNotStarted = "not_started" // exec refused before its process started
	OutcomeStarted    = "started"     // background process started
	OutcomeAbandoned  = "abandoned"   // exec stream closed before the exit
)

// opPoolFill is the operation label of a warm pool's fill (the create of
// a hidden sandbox): creates are only those callers asked for.
const opPoolFill = "pool_fill"

// durationBuckets span 5 ms to ~2.5 min: execs and lifecycle operations.
var durationBuckets = prometheus.ExponentialBuckets(0.005, 2, 15)

// New returns the metrics extension with its private registry; the
// daemon passes it to the core in sandbox.Config.Extensions and serves
// Handler.
func New(cfg Config) *Metrics {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Metrics{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	m.operations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentbox_operations_total",
		Help: "Operations of the sandbox core as they complete, by kind (create, delete, exec, checkpoint, restore, fork, ...) and outcome (ok, error).",
	}, []string{"operation", "outcome"})
	m.createSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentbox_sandbox_create_duration_seconds",
		Help:    "Time to create a sandbox (from a template or a warm pool), by outcome.",
		Buckets: durationBuckets,
	}, []string{"outcome"})
	m.opSeconds = map[string]*prometheus.HistogramVec{}
	for _, k := range []string{sandbox.OpCheckpoint, sandbox.OpRestore, sandbox.OpFork} {
		m.opSeconds[k] = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentbox_" + k + "_duration_seconds",
			Help:    "Time a " + k + " took, by outcome.",
			Buckets: durationBuckets,
		}, []string{"outcome"})
	}
	m.execs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentbox_execs_total",
		Help: "Commands run in sandboxes, by mode (foreground, background) and outcome (ok, nonzero, signal, timeout, oom, error, not_started, abandoned; started for background).",
	}, []string{"mode", "outcome"})
	m.execSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentbox_exec_duration_seconds",
		Help:    "Round trip of a foreground exec inside the daemon: from the request reaching the sandbox to its exit, by outcome.",
		Buckets: durationBuckets,
	}, []string{"outcome"})
	m.egress = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentbox_egress_decisions_total",
		Help: "Decisions of the egress proxy, by decision (allowed, denied) and kind (connect, request).",
	}, []string{"decision", "kind"})
	m.limitEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentbox_limit_events_total",
		Help: "Limit events the core reported (type oom: an OOM kill in a sandbox).",
	}, []string{"type"})
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentbox_sandbox_transitions_total",
		Help: "Sandbox state transitions, by the state entered.",
	}, []string{"to"})
	m.reg.MustRegister(m.operations, m.createSeconds, m.execs, m.execSeconds, m.egress, m.limitEvents, m.transitions,
		scrapeCollector{m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, h := range m.opSeconds {
		m.reg.MustRegister(h)
	}
	return m
}

// Name implements sandbox.Extension.
func (m *Metrics) Name() string { return "metrics" }

// Registry is the private registry the metrics are kept in (tests gather
// from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format (or
// OpenMetrics, when the scraper asks for it).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
}

func outcomeOf(err error) string {
	if err != nil {
		return OutcomeError
	}
	return OutcomeOK
}

// Observe implements sandbox.Observer: it counts op and, for the kinds
// that are timed, observes op.Duration.
func (m *Metrics) Observe(_ context.Context, op sandbox.Op) {
	switch op.Kind {
	case sandbox.OpTransition:
		if op.Transition != nil {
			m.transitions.WithLabelValues(op.Transition.To).Inc()
		}
		return
	case sandbox.OpEvent:
		if op.Event != nil {
			m.limitEvents.WithLabelValues(op.Event.Type).Inc()
		}
		return
	case sandbox.OpGuestCall, sandbox.OpAttach:
		// Too frequent to be useful as operations; their failures show in
		// the API's logs.
		return
	}
	outcome := outcomeOf(op.Err)
	if op.Hidden {
		if op.Kind == sandbox.OpCreate {
			m.operations.WithLabelValues(opPoolFill, outcome).Inc()
		}
		// Other operations on a pool's hidden sandbox are the pool's own
		// housekeeping (pausing it, deleting a surplus one).
		return
	}
	m.operations.WithLabelValues(op.Kind, outcome).Inc()
	if op.Duration <= 0 {
		return
	}
	if op.Kind == sandbox.OpCreate {
		m.createSeconds.WithLabelValues(outcome).Observe(op.Duration.Seconds())
	} else if h, ok := m.opSeconds[op.Kind]; ok {
		h.WithLabelValues(outcome).Observe(op.Duration.Seconds())
	}
}

// Egress counts one decision of the egress proxy (egress.Config.OnRecord).
func (m *Metrics) Egress(rec api.EgressRecord) {
	m.egress.WithLabelValues(rec.Decision, rec.Kind).Inc()
}

// scrapeCollector computes the gauges read at scrape time.
type scrapeCollector struct{ m *Metrics }

var (
	sandboxesDesc = prometheus.NewDesc("agentbox_sandboxes",
		"Sandboxes the daemon has, by state and backend (warm pools' sandboxes are in agentbox_warm_pool_sandboxes).",
		[]string{"state", "backend"}, nil)
	poolDesc = prometheus.NewDesc("agentbox_warm_pool_sandboxes",
		"Sandboxes of each warm pool, by template, backend and state (ready: claimable now; filling: being created).",
		[]string{"template", "backend", "state"}, nil)
	poolTargetDesc = prometheus.NewDesc("agentbox_warm_pool_target_sandboxes",
		"Configured size of each warm pool, by template and backend.",
		[]string{"template", "backend"}, nil)
	storeDesc = prometheus.NewDesc("agentbox_store_bytes",
		"Size in bytes of the daemon's metadata store file (sandbox, checkpoint, run and tenant records).",
		nil, nil)
)

func (c scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- poolDesc
	ch <- poolTargetDesc
	ch <- storeDesc
}

// scrapeTimeout bounds the listing done at one scrape.
const scrapeTimeout = 10 * time.Second

func (c scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	cfg := c.m.cfg
	if c.m.core != nil {
		sbs, err := c.m.core.ListSandboxes(tenant.WithPrincipal(ctx, tenant.Admin), nil)
		if err != nil {
			c.m.log.Warn("metrics: listing sandboxes", "err", err)
			ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
		} else {
			type key struct{ state, backend string }
			n := map[key]int{}
			for _, sb := range sbs {
				n[key{sb.State, sb.Backend}]++
			}
			for k, v := range n {
				ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(v), k.state, k.backend)
			}
		}
	}
	if cfg.Pools != nil {
		pools, err := cfg.Pools(ctx)
		if err != nil {
			c.m.log.Warn("metrics: listing warm pools", "err", err)
			ch <- prometheus.NewInvalidMetric(poolDesc, err)
		} else {
			for _, p := range pools {
				ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(p.Ready), p.Template, p.Runtime, "ready")
				ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(p.Filling), p.Template, p.Runtime, "filling")
				ch <- prometheus.MustNewConstMetric(poolTargetDesc, prometheus.GaugeValue, float64(p.Size), p.Template, p.Runtime)
			}
		}
	}
	if cfg.StorePath != "" {
		fi, err := os.Stat(cfg.StorePath)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(storeDesc, err)
		} else {
			ch <- prometheus.MustNewConstMetric(storeDesc, prometheus.GaugeValue, float64(fi.Size()))
		}
	}
}
