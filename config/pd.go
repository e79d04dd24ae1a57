package config

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
)

// PD configures prefill/decode disaggregation for a model whose pool has
// prefill or decode endpoints (Endpoint.Role). It has no effect on a pool
// of "both" endpoints.
type PD struct {
	// Protocol is the engines' handoff: nixl (vLLM NixlConnector,
	// kv_transfer_params) or sglang (bootstrap_host/port/room); default nixl.
	// The placement sizes each transfer for it (disagg.Config.Protocol).
	Protocol string `yaml:"protocol"`
	// Mode is conditional (disaggregate only when the estimate says it
	// pays), always or never; default conditional.
	Mode string `yaml:"mode"`
	// Profile names the engine profile whose cost model the placement
	// estimates with (see engine.ProfileNames); default
	// "llama-3.1-8b-h100".
	Profile string `yaml:"profile"`
	// Links map endpoint pairs to fabric links by shared labels, first
	// match wins; default: same node label -> NVLink 3600 Gb/s, same rack or
	// zone -> RDMA 400 Gb/s. The data-parallel ranks of one endpoint
	// without a node label share one (their URL's).
	Links []PDLink `yaml:"links"`
	// DefaultLink is the link between endpoints no rule matches; default
	// TCP 100 Gb/s with 2 ms setup.
	DefaultLink PDLink `yaml:"default_link"`
	// ShortTokens: an uncached prompt this short runs aggregated; default
	// 256, negative disables. A written 0 is refused here and in the
	// fields below (it took the default): a negative value turns a rule
	// off.
	ShortTokens int `yaml:"short_tokens,omitempty" zero:"-1 turns the rule off (default 256)"`
	// LocalISL and LocalRatio: Dynamo's rule, uncached < local_isl and
	// uncached/prompt < local_ratio runs aggregated; defaults 2048 and 0.7,
	// either negative disables.
	LocalISL   int     `yaml:"local_isl,omitempty" zero:"-1 turns the rule off (default 2048)"`
	LocalRatio float64 `yaml:"local_ratio,omitempty" zero:"-1 turns the rule off (default 0.7)"`
	// MaxLocalTokens: the longest uncached prompt a decode node prefills
	// itself; default 16384, negative: none for being estimated cheaper.
	MaxLocalTokens int `yaml:"max_local_tokens,omitempty" zero:"-1 turns the rule off: no prompt then runs on the decode node for being cheaper there (default 16384)"`
	// Margin: how much cheaper (fraction) the aggregated estimate must be;
	// default 0.1.
	Margin float64 `yaml:"margin,omitempty" zero:"write a small fraction (0.001) for almost none (default 0.1)"`
	// Attempts is the most placements tried per request; default 3.
	Attempts int `yaml:"attempts,omitempty" zero:"1 tries one placement (default 3)"`
	// BootstrapPort is the prefill engines' SGLang bootstrap port when the
	// endpoint has no bootstrap_port label; default 8998.
	BootstrapPort int `yaml:"bootstrap_port,omitempty" zero:"write the prefill engines' port (SGLang's default 8998), or leave it out"`
}

// PDLink is one fabric link class.
type PDLink struct {
	// Name labels the link in metrics (nvlink, rdma, tcp).
	Name string `yaml:"name"`
	// Same lists the labels both endpoints must share (rules only).
	Same []string `yaml:"same"`
	// Gbps is the line rate in Gb/s. Required.
	Gbps float64 `yaml:"gbps,omitempty" zero:"write the link's line rate (a link of 0 Gb/s moves nothing)"`
	// Efficiency is the fraction of the line rate reached; default 1.
	Efficiency float64 `yaml:"efficiency,omitempty" zero:"leave it out for line rate (1)"`
	// Setup is the fixed cost of one transfer; default 0.
	Setup time.Duration `yaml:"setup"`
}

// PD defaults.
const (
	DefaultPDProtocol = "nixl"
	DefaultPDMode     = "conditional"
	DefaultPDProfile  = "llama-3.1-8b-h100"
)

// Disaggregated reports whether the model's pool has prefill or decode
// endpoints: listed, or, for a discovered model, the endpoint template of
// one of its discovery's sources.
func (m *Model) Disaggregated() bool {
	pd := func(role string) bool {
		r, err := kvroute.ParseRole(role)
		return err == nil && r != kvroute.RoleBoth
	}
	for _, e := range m.Endpoints {
		if pd(e.Role) {
			return true
		}
	}
	srcs, _ := m.Discovery.KubernetesSources()
	for _, k := range srcs {
		if pd(k.Endpoint.Role) {
			return true
		}
	}
	return false
}

func (p *PD) applyDefaults() {
	setDefault(&p.Protocol, DefaultPDProtocol)
	setDefault(&p.Mode, DefaultPDMode)
	setDefault(&p.Profile, DefaultPDProfile)
}

func (p *PD) validate(v *validator, path string) {
	if p.Protocol != "nixl" && p.Protocol != "sglang" {
		v.addf(path+".protocol", "%q is not one of nixl, sglang", p.Protocol)
	}
	if p.Mode != "conditional" && p.Mode != "always" && p.Mode != "never" {
		v.addf(path+".mode", "%q is not one of conditional, always, never", p.Mode)
	}
	link := func(lp string, l PDLink, rule bool) {
		if rule && len(l.Same) == 0 {
			v.addf(lp+".same", "must list at least one label")
		}
		if v.finite(lp+".gbps", l.Gbps) && l.Gbps <= 0 {
			v.addf(lp+".gbps", "%v is not positive", l.Gbps)
		}
		if v.finite(lp+".efficiency", l.Efficiency) && (l.Efficiency < 0 || l.Efficiency > 1) {
			v.addf(lp+".efficiency", "%v is not in [0, 1]", l.Efficiency)
		}
		if l.Setup < 0 {
			v.addf(lp+".setup", "%v is negative", l.Setup)
		}
	}
	for i, l := range p.Links {
		link(fmt.Sprintf("%s.links[%d]", path, i), l, true)
	}
	if d := p.DefaultLink; d.Name != "" || d.Gbps != 0 || d.Efficiency != 0 || d.Setup != 0 || len(d.Same) > 0 {
		link(path+".default_link", p.DefaultLink, false)
	}
	if v.finite(path+".local_ratio", p.LocalRatio) && p.LocalRatio > 1 {
		v.addf(path+".local_ratio", "%v is more than 1", p.LocalRatio)
	}
	if v.finite(path+".margin", p.Margin) && p.Margin >= 1 {
		v.addf(path+".margin", "%v is not below 1", p.Margin)
	}
	if p.Attempts < 0 {
		v.addf(path+".attempts", "%d is negative", p.Attempts)
	}
	if p.BootstrapPort < 0 || p.BootstrapPort > 65535 {
		v.addf(path+".bootstrap_port", "%d is not a port", p.BootstrapPort)
	}
}
