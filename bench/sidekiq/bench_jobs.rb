# Sidekiq's side of the bench (Debian's ruby-sidekiq): the same jobs as every other system.
#   REDIS_URL=redis://127.0.0.1:PORT/0 sidekiq -r ./bench/sidekiq/bench_jobs.rb -c 10 -q default
# Payloads are pushed from Python in Sidekiq's own format (bench/systems.py), as Sidekiq::Client would.
# Logging at WARN: at INFO Sidekiq writes two lines per job, as cogworker would.
#
# CpuBurn's loop count is calibrated at load to about 200 µs of CPU, unless BENCH_CPU_BURN_LOOPS_RUBY
# gives it: the bench runs `ruby bench/sidekiq/bench_jobs.rb` once, which prints the calibration as
# JSON, and passes the loops to every Sidekiq it starts, so each drain burns the same loops.
require "json"
require "sidekiq"

Sidekiq.configure_server do |config|
  config.logger.level = Logger::WARN
end

CPU_BURN_TARGET_US = 200

def burn(loops)
  x = 0
  i = 0
  while i < loops
    x += i
    i += 1
  end
  x
end

# This thread's CPU time: a preemption by another process does not count.
def cpu_us(loops)
  t = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)
  burn(loops)
  (Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond) - t) / 1000.0
end

# [loops that take target_us of CPU here, µs they took]: the fastest of a few timings.
def calibrate(target_us = CPU_BURN_TARGET_US)
  probe = 20_000
  per_loop_us = Array.new(5) { cpu_us(probe) }.min / probe
  loops = [1, (target_us / per_loop_us).round].max
  [loops, Array.new(20) { cpu_us(loops) }.min]
end

CPU_BURN_LOOPS, CPU_BURN_US =
  ENV["BENCH_CPU_BURN_LOOPS_RUBY"] ? [Integer(ENV["BENCH_CPU_BURN_LOOPS_RUBY"]), nil] : calibrate

class NoopIncr
  include Sidekiq::Worker

  def perform(t = 0.0)
    Sidekiq.redis { |c| c.incr("bench:done") }
  end
end

class Stamp
  include Sidekiq::Worker

  def perform(t = 0.0)
    late = Time.now.to_f - t
    Sidekiq.redis do |c|
      c.pipelined do |p|
        p.rpush("bench:lat", late)
        p.incr("bench:done")
      end
    end
  end
end

class IoWait
  include Sidekiq::Worker

  def perform(t = 0.0)
    Sidekiq.redis { |c| c.get("bench:io") }
    sleep 0.001
    Sidekiq.redis { |c| c.incr("bench:done") }
  end
end

class CpuBurn
  include Sidekiq::Worker

  def perform(t = 0.0)
    burn(CPU_BURN_LOOPS)
    Sidekiq.redis { |c| c.incr("bench:done") }
  end
end

if $PROGRAM_NAME == __FILE__
  puts JSON.generate({ "loops" => CPU_BURN_LOOPS, "us" => CPU_BURN_US&.round(1) })
end
