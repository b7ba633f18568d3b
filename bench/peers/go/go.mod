module jackdaw/bench/peers/go

go 1.19
