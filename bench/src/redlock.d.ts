// redlock 4 ships no types: the part of its API the bench uses.
declare module "redlock" {
  import type { Redis } from "ioredis"

  namespace Redlock {
    interface Lock {
      readonly resource: string | ReadonlyArray<string>
      readonly value: string
      readonly expiration: number
      unlock(): Promise<void>
    }
    interface Options {
      readonly driftFactor?: number
      /** -1: retry forever. Default 10. */
      readonly retryCount?: number
      /** ms between attempts. Default 200. */
      readonly retryDelay?: number
      /** ± ms added to each delay. Default 100. */
      readonly retryJitter?: number
    }
  }

  class Redlock {
    constructor(clients: ReadonlyArray<Redis>, options?: Redlock.Options)
    lock(resource: string, ttl: number): Promise<Redlock.Lock>
  }

  export default Redlock
}
