package policy

import (
	"strconv"

	"github.com/zeebo/xxh3"
)

// strHash is the fast 64-bit string hash kvroute's own policies use.
func strHash(s string) uint64 { return xxh3.HashString(s) }

// vnodeHash places virtual node replica of endpoint id on kv-aware's rings.
func vnodeHash(id string, replica int) uint64 {
	var buf [20]byte
	return mix64(xxh3.HashString(id) ^ xxh3.Hash(strconv.AppendInt(buf[:0], int64(replica), 10)))
}

// hrw is the rendezvous (highest random weight) score of endpoint id for key:
// ranking endpoints by it gives every key a stable preference order that
// moves few keys when endpoints come and go.
func hrw(key uint64, id string) uint64 { return mix64(key ^ xxh3.HashString(id)) }
