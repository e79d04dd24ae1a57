package proxy

import (
	"errors"
)

// errRetry is returned by modifyResponse for a 5xx, or a response that
// failed before its first body byte, that another endpoint may serve;
// upstreamError recognises it and leaves the response unwritten.
var errRetry = errors.New("proxy: retryable upstream status")

// retryReason says why an attempt is retried: the reason label of
// kvroute_retries_total.
type retryReason uint8

const (
	retryNone    retryReason = iota
	retryConnect             // dial error (disagg.IsConnectError): the engine never saw the request
	retryReset               // other transport error before the first body byte: the engine may have run part of the work
	retryStatus              // 5xx response headers, before any body byte reached the client
	retryGone                // the endpoint left the pool (a reload) before the attempt was sent
	retryAdapter             // the engine cannot run the request's LoRA adapter (llama.cpp's list): not sent
)

func (r retryReason) String() string {
	switch r {
	case retryConnect:
		return "connect_error"
	case retryReset:
		return "upstream_reset"
	case retryStatus:
		return "status_5xx"
	case retryGone:
		return "endpoint_removed"
	case retryAdapter:
		return "adapter_not_listed"
	}
	return "none"
}

// canRetry reports whether this exchange may try another endpoint after
// the current attempt fails before its first byte.
func (x *exchange) canRetry() bool {
	return x.attempt+1 < x.maxAttempts && x.p.pools[x.req.Model] != nil
}
