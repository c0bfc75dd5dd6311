/**
 * JupyterLab shows why a kernel refused Restart or Interrupt (docs/inspection.md).
 *
 * Jupyter Server with lemon_exec.viewer answers HTTP 409 with the reason when a person
 * restarts an agent's live session kernel, or interrupts it while the agent's script runs.
 * JupyterLab itself only logs a failed restart to the browser console and leaves a failed
 * interrupt as an unhandled promise, so this plugin wraps both methods of every kernel
 * connection (whatever button, menu or command started them) and shows the server's reason
 * as a notification. A restart the server's kernel model says it would refuse is not sent
 * at all (JupyterLab drops its running cells' outputs when it sends one); the 409 stays the
 * fallback. JupyterLab's restart dialog also reports a refused restart as done,
 * so "Restart Kernel and Run All Cells" would go on to run every cell on the agent's
 * kernel: the dialog's answer is corrected to "not restarted".
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Dialog,
  ISessionContext,
  ISessionContextDialogs,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { Kernel, KernelAPI, KernelConnection, ServerConnection } from '@jupyterlab/services';

/** JupyterLab cuts a notification's message at this many characters. */
const MAX_MESSAGE = 140;

type Action = 'restart' | 'interrupt';
type Method = (this: KernelConnection) => Promise<void>;

/** Kernel connections whose last restart the server refused. */
const refusedRestart = new WeakSet<KernelConnection>();

/** The last refusal toast per action, so repeated clicks show one toast, not a pile. */
const shown = new Map<Action, string>();

/** The server's reason for a refusal (HTTP 409), or null for any other failure. */
export function refusalReason(error: unknown): string | null {
  if (!(error instanceof ServerConnection.ResponseError) || error.response.status !== 409) {
    return null;
  }
  return error.message || `the server refused it (HTTP 409)`;
}

/** The toast's text: the reason as the server wrote it, capitalised. */
export function toastMessage(action: Action, reason: string): string {
  const text = reason.toLowerCase().startsWith(action) ? reason : `${action} refused: ${reason}`;
  return text.charAt(0).toUpperCase() + text.slice(1);
}

function notify(action: Action, reason: string): void {
  const previous = shown.get(action);
  if (previous !== undefined) {
    Notification.dismiss(previous);
  }
  const message = toastMessage(action, reason);
  const title = action === 'restart' ? 'Kernel not restarted' : 'Kernel not interrupted';
  const actions =
    message.length > MAX_MESSAGE
      ? [
          {
            label: 'Show reason',
            callback: () => {
              void showDialog({ title, body: message, buttons: [Dialog.okButton()] });
            }
          }
        ]
      : [];
  shown.set(action, Notification.warning(message, { autoClose: false, actions }));
}

/** KernelConnection's own status setter: not public, so used only where it exists. */
type WithStatusSetter = { _updateStatus?: (status: Kernel.Status) => void };

function wrap(action: Action, original: Method): Method {
  return async function (this: KernelConnection): Promise<void> {
    const before = this.status;
    try {
      await original.call(this);
    } catch (error) {
      const reason = refusalReason(error);
      if (reason !== null) {
        notify(action, reason);
        if (action === 'restart') {
          refusedRestart.add(this);
        }
        // A refused restart left the connection saying "restarting" although the kernel
        // was not touched: show the status it had (the next status message updates it).
        if (this.status === 'restarting' && before !== 'restarting') {
          (this as unknown as WithStatusSetter)._updateStatus?.(before);
        }
      }
      throw error;
    }
  };
}

/** The server's reason to refuse restarting this kernel, from its kernel model
 * (lemon_exec.viewer), or null: a kernel it would restart, or no answer. */
async function restartRefusal(kernel: KernelConnection): Promise<string | null> {
  try {
    const model = (await KernelAPI.getKernelModel(kernel.id, kernel.serverSettings)) as
      | { lemon_exec?: { restart_refused?: unknown } }
      | undefined;
    const reason = model?.lemon_exec?.restart_refused;
    return typeof reason === 'string' ? reason : null;
  } catch {
    return null;
  }
}

/** Restart: refused here, before JupyterLab sends the request, when the server says it
 * would refuse; sending it would drop the outputs of the person's running cells. */
function guardRestart(restart: Method): Method {
  return async function (this: KernelConnection): Promise<void> {
    const reason = await restartRefusal(this);
    if (reason === null) {
      return restart.call(this);
    }
    notify('restart', reason);
    refusedRestart.add(this);
    throw new Error(toastMessage('restart', reason));
  };
}

/** The restart dialog answers "restarted" only if the kernel really was. */
function correctRestartDialog(dialogs: ISessionContext.IDialogs): void {
  const original = dialogs.restart.bind(dialogs);
  dialogs.restart = async (
    context: ISessionContext,
    options?: ISessionContext.IRestartOptions
  ): Promise<boolean> => {
    const kernel = context.session?.kernel;
    if (kernel instanceof KernelConnection) {
      refusedRestart.delete(kernel);
    }
    const restarted = await original(context, options);
    return restarted && !(kernel instanceof KernelConnection && refusedRestart.has(kernel));
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'lemon-exec-jupyterlab:refusals',
  description: 'Shows why a kernel refused Restart or Interrupt (HTTP 409).',
  autoStart: true,
  optional: [ISessionContextDialogs],
  activate: (_app: JupyterFrontEnd, dialogs: ISessionContext.IDialogs | null): void => {
    const proto = KernelConnection.prototype as unknown as Record<Action, Method>;
    proto.restart = guardRestart(wrap('restart', proto.restart));
    proto.interrupt = wrap('interrupt', proto.interrupt);
    if (dialogs) {
      correctRestartDialog(dialogs);
    }
  }
};

export default plugin;
