package config_test

import (
	"fmt"

	"github.com/kvroute/kvroute/config"
)

func Example() {
	c := config.Config{Models: []config.Model{{
		Name:      "llama-3.1-8b",
		Endpoints: []config.Endpoint{{URL: "http://10.0.0.7:8000"}, {URL: "htp://10.0.0.8:8000"}},
	}}}
	c.ApplyDefaults()
	fmt.Println(c.Listen, c.Models[0].Policy.Name, c.Retry.Attempts)
	fmt.Println(c.Validate())
	// Output:
	// :8080 kv-aware 2
	// models[0].endpoints[1].url: "htp://10.0.0.8:8000" is not an http(s) URL
}
