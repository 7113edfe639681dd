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

# Debian pairs Sidekiq 6.4.1 with redis-rb 4.8, which Sidekiq 6.4 predates: on every BRPOP (a
# positional timeout) and every single-member SADD, redis-rb 4.8 builds a deprecation message with a
# `caller` lookup and writes it to stderr. Sidekiq 6.5 and later never trigger them, and an
# application on 6.4 silences them with these two public settings of redis-rb. Neither changes a
# command sent: the first only stops the warning, the second only stops SADD's reply being turned
# into a boolean (Sidekiq ignores it). BENCH_SIDEKIQ_WARNINGS=1 keeps the warnings, to measure them.
unless ENV["BENCH_SIDEKIQ_WARNINGS"] == "1"
  Redis.silence_deprecations = true
  Redis.sadd_returns_boolean = false
end

# The C reply parser, as redis-py's hiredis on the Python side: redis-rb uses the last driver
# loaded, and Sidekiq 6 passes `driver: Redis::Connection.drivers.last`. Debian's ruby-hiredis has
# it; BENCH_SIDEKIQ_HIREDIS=0 runs the pure-Ruby driver.
unless ENV["BENCH_SIDEKIQ_HIREDIS"] == "0"
  begin
    require "redis/connection/hiredis"
  rescue LoadError
    nil # (ruby-hiredis not installed: the pure-Ruby driver, said in the results' versions)
  end
end

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
  puts JSON.generate({ "loops" => CPU_BURN_LOOPS, "us" => CPU_BURN_US&.round(1),
                       "driver" => Redis::Connection.drivers.last.name,
                       "silenced" => Redis.silence_deprecations ? true : false,
                       "yjit" => defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? true : false })
end
