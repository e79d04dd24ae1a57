package engine

// deque is a FIFO of sequences with O(1) push at both ends (vLLM's waiting
// queue: new requests at the back, preempted ones back at the front).
type deque struct {
	buf        []*sequence
	head, size int
}

func (q *deque) len() int { return q.size }

func (q *deque) grow() {
	n := max(2*len(q.buf), 16)
	buf := make([]*sequence, n)
	for i := 0; i < q.size; i++ {
		buf[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = buf, 0
}

func (q *deque) pushBack(s *sequence) {
	if q.size == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.size)%len(q.buf)] = s
	q.size++
}

func (q *deque) pushFront(s *sequence) {
	if q.size == len(q.buf) {
		q.grow()
	}
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = s
	q.size++
}

func (q *deque) front() *sequence { return q.buf[q.head] }

func (q *deque) popFront() *sequence {
	s := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	return s
}

// at returns the i-th element from the front.
func (q *deque) at(i int) *sequence { return q.buf[(q.head+i)%len(q.buf)] }

// remove deletes s (O(n); used by Abort only).
func (q *deque) remove(s *sequence) {
	for i := 0; i < q.size; i++ {
		if q.at(i) != s {
			continue
		}
		for j := i; j < q.size-1; j++ {
			q.buf[(q.head+j)%len(q.buf)] = q.at(j + 1)
		}
		q.buf[(q.head+q.size-1)%len(q.buf)] = nil
		q.size--
		return
	}
}
