/**
 * Dead connections of node-zookeeper-client, given up on. The library waits for the server's
 * answer to its handshake without a limit once the TCP connection is open (a server still
 * starting can accept a connection and never read it), and never notices a connection on which
 * the server has gone silent (a member cut off from this client while the others are not):
 * either way the client sits on that connection until its session has expired, holds and all.
 * ZooKeeper's Java client bounds both; so does this:
 *
 * - an attempt not answered within a third of the session timeout (from its socket's creation)
 *   is dropped. The Java client allows the session timeout divided by the number of servers: a
 *   third lets even a single server that restarts be tried again within the session;
 * - a connection on which nothing has been heard for two thirds of the session timeout (the
 *   client pings every third when idle) is dropped, the Java client's read timeout.
 *
 * The client then connects again, to the next server, and resumes its session while it lives.
 * This reaches into the client's connection manager (an EventEmitter with `state` events and its
 * current `socket`); a client without one is left as it is.
 */
import type * as net from "node:net"
import type * as Zk from "node-zookeeper-client"

/** node-zookeeper-client's `ConnectionManager.STATES`. */
const CONNECTING = 1
const CONNECTED = 2
const CONNECTED_READ_ONLY = 3

interface ConnectionManager {
  readonly state: number
  readonly socket?: net.Socket | undefined
  readonly getSessionTimeout: () => number
  on(event: "state", listener: (state: number) => void): unknown
  removeListener(event: "state", listener: (state: number) => void): unknown
}

const connectionManagerOf = (client: Zk.Client): ConnectionManager | undefined => {
  const manager = (client as unknown as { readonly connectionManager?: Partial<ConnectionManager> }).connectionManager
  return manager !== undefined && typeof manager.on === "function" && typeof manager.removeListener === "function" &&
      typeof manager.getSessionTimeout === "function" && typeof manager.state === "number"
    ? manager as ConnectionManager
    : undefined
}

/** Why a connection was dropped. */
class DeadConnection extends Error {
  constructor(message: string) {
    super(message)
    this.name = "DeadConnection"
  }
}

/**
 * Watches `client`'s connections until the returned function is called, checking every twentieth
 * of the session timeout (within 50 ms to 500 ms).
 */
export const guardConnections = (client: Zk.Client): () => void => {
  const manager = connectionManagerOf(client)
  if (manager === undefined) return () => {}
  const everyMs = Math.min(500, Math.max(50, manager.getSessionTimeout() / 20))
  // the attempt's clock starts with its socket: the library may wait (its spin delay) between
  // announcing an attempt and making it
  let attemptSocket: net.Socket | undefined
  let attemptStartedAt = 0
  let lastHeardAt = performance.now()
  let heardOn: net.Socket | undefined
  const heard = () => {
    lastHeardAt = performance.now()
  }
  const listen = (socket: net.Socket | undefined) => {
    if (socket === heardOn) return
    heardOn?.removeListener("data", heard)
    heardOn = socket
    socket?.on("data", heard)
  }
  const onState = (state: number) => {
    if (state === CONNECTED || state === CONNECTED_READ_ONLY) {
      heard()
      listen(manager.socket)
    }
  }
  // dropped with an error, so that the library also clears its own connect timer for this socket
  const drop = (socket: net.Socket, why: string) => socket.destroy(new DeadConnection(why))
  let lastCheckAt = performance.now()
  const check = () => {
    const now = performance.now()
    // a check late by much means this process was stalled, and what the server sent meanwhile
    // has not been read yet: judge on the next one
    const stalled = now - lastCheckAt > 2 * everyMs
    lastCheckAt = now
    const socket = manager.socket
    if (stalled || socket === undefined || socket.destroyed) return
    const sessionTimeoutMs = manager.getSessionTimeout()
    if (manager.state === CONNECTING) {
      if (socket !== attemptSocket) {
        attemptSocket = socket
        attemptStartedAt = now
      } else if (now - attemptStartedAt > sessionTimeoutMs / 3) {
        drop(socket, `no answer within ${Math.round(sessionTimeoutMs / 3)} ms`)
      }
    } else if ((manager.state === CONNECTED || manager.state === CONNECTED_READ_ONLY) && now - lastHeardAt > sessionTimeoutMs * 2 / 3) {
      drop(socket, `nothing heard for ${Math.round(sessionTimeoutMs * 2 / 3)} ms`)
    }
  }
  manager.on("state", onState)
  if (manager.state === CONNECTED || manager.state === CONNECTED_READ_ONLY) listen(manager.socket)
  const timer = setInterval(check, everyMs)
  timer.unref()
  return () => {
    clearInterval(timer)
    manager.removeListener("state", onState)
    listen(undefined)
  }
}
