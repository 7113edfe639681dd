# Sidekiq's side of the bench (Debian's ruby-sidekiq): the same two jobs as every other system.
#   REDIS_URL=redis://127.0.0.1:PORT/0 sidekiq -r ./bench/sidekiq/bench_jobs.rb -c 10 -q default
# Payloads are pushed from Python in Sidekiq's own format (bench/systems.py), as Sidekiq::Client would.
# Logging at WARN: at INFO Sidekiq writes two lines per job, as cogworker would.
require "sidekiq"

Sidekiq.configure_server do |config|
  config.logger.level = Logger::WARN
end

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
