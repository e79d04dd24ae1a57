package signals_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/signals"
)

func ExampleView() {
	const body = `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",engine="0"} 1
`
	m, err := signals.ParseMetrics(strings.NewReader(body), "text/plain; version=0.0.4", signals.FlavorAuto)
	if err != nil {
		fmt.Println(err)
		return
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v := signals.NewView(signals.ViewConfig{StaleAfter: time.Second})
	v.Observe(start, m)

	// A burst of three requests right after the scrape.
	for i := 0; i < 3; i++ {
		v.Dispatch(start.Add(10*time.Millisecond), 2000)
	}
	l := v.Load(start.Add(20 * time.Millisecond))
	fmt.Printf("%s: waiting %d running %d kv %.2f stale %v\n", m.Flavor, l.Waiting, l.Running, l.KVUsage, l.Stale)

	l = v.Load(start.Add(2 * time.Second))
	fmt.Printf("2s later: waiting %d running %d stale %v\n", l.Waiting, l.Running, l.Stale)
	// Output:
	// vllm: waiting 3 running 2 kv 0.62 stale false
	// 2s later: waiting 3 running 0 stale true
}
